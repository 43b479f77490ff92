from __future__ import annotations

import pytest

from shardyard.bus.topics import HEARTBEATS, partition_of
from shardyard.events import (
    ArtifactPlace,
    Event,
    FailureCause,
    Heartbeat,
    JobCancelled,
    JobFailed,
    JobPreempted,
    JobSucceeded,
    NodeDrain,
    NodeLost,
    NodeState,
    NodeStatus,
    RevocationReason,
    ShardPreempted,
    ShardRevocation,
    lease_of,
)
from shardyard.liveness import MAX_MARGIN_S
from shardyard.resource_pool.book import PoolBook
from tests.unit.builders import assignment, at, completed, failed, gpus, heartbeat, node_state


def statuses(events: list[Event]) -> list[tuple[str, str]]:
    return [
        (type(e).__name__, e.status if isinstance(e, NodeState) else e.node_id)  # type: ignore[attr-defined]
        for e in events
    ]


def alive_book(*nodes: str) -> PoolBook:
    book = PoolBook(suspect_after_s=3.0, lost_after_s=10.0)
    for node_id in nodes or ("node-a",):
        book.on_heartbeat(heartbeat(node_id, gpus=gpus(count=4)), at(0))
    return book


def test_heartbeat_gives_an_alive_node_state() -> None:
    book = PoolBook()
    beat = heartbeat("node-a", seq=4, cpu_load=0.3, occurred_at=at(-1))

    (state,) = book.on_heartbeat(beat, at(0))

    assert isinstance(state, NodeState)
    assert (state.node_id, state.status, state.agent_instance) == ("node-a", NodeStatus.ALIVE, beat.agent_instance)
    assert (state.occurred_at, state.last_heartbeat_at) == (at(0), at(0))
    assert (state.gpus, state.cpu_cores, state.memory_bytes, state.cpu_load) == (
        beat.gpus,
        32.0,
        beat.memory_bytes,
        0.3,
    )
    assert (state.address, state.rendezvous_ports, state.allocated_gpus) == (beat.address, beat.rendezvous_ports, ())


@pytest.mark.parametrize(
    ("ticks", "expected"),
    [
        pytest.param([2.9], [[]], id="quiet-but-fresh"),
        pytest.param([3.0], [[("NodeState", NodeStatus.SUSPECT)]], id="suspect-at-3s"),
        pytest.param([3.0, 5.0], [[("NodeState", NodeStatus.SUSPECT)], []], id="suspect-once"),
        pytest.param(
            [3.0, 10.0, 11.0, 60.0],
            [[("NodeState", NodeStatus.SUSPECT)], [("NodeState", NodeStatus.LOST), ("NodeLost", "node-a")], [], []],
            id="lost-once",
        ),
        pytest.param([25.0], [[("NodeState", NodeStatus.LOST), ("NodeLost", "node-a")]], id="alive-straight-to-lost"),
    ],
)
def test_silence(ticks: list[float], expected: list[list[tuple[str, str]]]) -> None:
    book = alive_book()

    assert [statuses(book.tick(at(t))) for t in ticks] == expected


def test_node_lost_carries_the_silence() -> None:
    book = alive_book()

    _, lost = book.tick(at(12))

    assert isinstance(lost, NodeLost)
    assert (lost.last_heartbeat_at, lost.silent_for_s, lost.occurred_at) == (at(0), 12.0, at(12))


def test_only_the_silent_node_is_suspected() -> None:
    book = alive_book("node-a", "node-b")
    book.on_heartbeat(heartbeat("node-b", seq=1), at(2))

    assert statuses(book.tick(at(4))) == [("NodeState", NodeStatus.SUSPECT)]
    assert book.state_of("node-b", at(4)).status is NodeStatus.ALIVE


@pytest.mark.parametrize("silence", [4.0, 12.0], ids=["from-suspect", "from-lost"])
def test_heartbeat_again_makes_the_node_alive(silence: float) -> None:
    book = alive_book()
    book.tick(at(silence))

    (state,) = book.on_heartbeat(heartbeat("node-a", seq=1), at(silence + 1))

    assert isinstance(state, NodeState) and state.status is NodeStatus.ALIVE
    assert book.tick(at(silence + 2)) == []


def test_reordered_heartbeat_of_the_same_agent_is_ignored() -> None:
    book = PoolBook()
    book.on_heartbeat(heartbeat(seq=5, cpu_load=0.5), at(0))

    assert book.on_heartbeat(heartbeat(seq=4, cpu_load=0.9), at(1)) == []
    assert book.state_of("node-a", at(1)).cpu_load == 0.5
    assert statuses(book.tick(at(3.5))) == [("NodeState", NodeStatus.SUSPECT)]


def test_restarted_agent_starts_its_sequence_again() -> None:
    book = PoolBook()
    book.on_heartbeat(heartbeat(seq=5), at(0))

    (state,) = book.on_heartbeat(heartbeat(seq=0, agent_instance="node-a-agent-2"), at(1))

    assert isinstance(state, NodeState) and state.agent_instance == "node-a-agent-2"


def test_assignment_reserves_gpus() -> None:
    book = alive_book()

    (state,) = book.on_ledger_event(assignment(shard_index=1, gpu_indices=(2,)), at(1))

    assert isinstance(state, NodeState) and state.allocated_gpus == (2,)
    book.on_ledger_event(assignment(shard_index=0, gpu_indices=(0,)))
    assert book.state_of("node-a", at(1)).allocated_gpus == (0, 2)


@pytest.mark.parametrize(
    ("release", "left"),
    [
        pytest.param(completed(shard_index=1), (0,), id="shard-completed"),
        pytest.param(failed(shard_index=0), (1,), id="shard-failed"),
        pytest.param(
            ShardRevocation(
                occurred_at=at(2),
                job_id="job-1",
                shard_index=0,
                node_id="node-a",
                attempt=1,
                term=1,
                reason=RevocationReason.JOB_FAILED,
            ),
            (1,),
            id="revocation",
        ),
        pytest.param(
            JobFailed(occurred_at=at(2), job_id="job-1", attempt=1, cause=FailureCause.KILLED, message="k"),
            (),
            id="job-failed",
        ),
        pytest.param(
            JobSucceeded(occurred_at=at(2), job_id="job-1", attempt=1, final_loss=1.0, checkpoint_dir=None),
            (),
            id="job-succeeded",
        ),
        pytest.param(
            ShardPreempted(
                occurred_at=at(2),
                job_id="job-1",
                shard_index=1,
                attempt=1,
                node_id="node-a",
                step=9,
                checkpoint_dir="/c",
            ),
            (0,),
            id="shard-preempted",
        ),
        pytest.param(
            JobPreempted(
                occurred_at=at(2), job_id="job-1", attempt=1, by_job="vip", checkpoint_dir=None, checkpoint_step=None
            ),
            (),
            id="job-preempted",
        ),
        pytest.param(JobCancelled(occurred_at=at(2), job_id="job-1", message="m"), (), id="job-cancelled"),
    ],
)
def test_release(release: Event, left: tuple[int, ...]) -> None:
    book = alive_book()
    book.on_ledger_event(assignment(shard_index=0))
    book.on_ledger_event(assignment(shard_index=1))

    (state,) = book.on_ledger_event(release, at(2))

    assert isinstance(state, NodeState) and state.allocated_gpus == left


def test_job_failed_releases_the_job_on_every_node_and_only_that_job() -> None:
    book = alive_book("node-a", "node-b")
    book.on_ledger_event(assignment(shard_index=0, node_id="node-a", gpu_indices=(0,)))
    book.on_ledger_event(assignment(shard_index=1, node_id="node-b", gpu_indices=(0,)))
    book.on_ledger_event(assignment("job-2", shard_index=0, node_id="node-b", gpu_indices=(3,)))

    events = book.on_ledger_event(
        JobFailed(occurred_at=at(2), job_id="job-1", attempt=1, cause=FailureCause.NODE_LOST, message="lost"), at(2)
    )

    assert [(e.node_id, e.allocated_gpus) for e in events] == [("node-a", ()), ("node-b", (3,))]  # type: ignore[attr-defined]


def test_a_late_end_of_an_old_attempt_keeps_the_new_attempt_reserved() -> None:
    book = alive_book()
    book.on_ledger_event(assignment(shard_index=0, gpu_indices=(0,)))
    book.on_ledger_event(assignment(shard_index=0, gpu_indices=(1,), attempt=2))

    (state,) = book.on_ledger_event(failed(shard_index=0), at(2))

    assert isinstance(state, NodeState) and state.allocated_gpus == (1,)


def test_an_assignment_of_a_deposed_leader_reserves_nothing() -> None:
    book = alive_book()
    book.on_ledger_event(assignment(shard_index=0, gpu_indices=(0,), term=7))

    assert book.on_ledger_event(assignment("job-2", shard_index=0, gpu_indices=(1,), term=6), at(1)) == []
    assert book.state_of("node-a", at(1)).allocated_gpus == (0,)
    book.on_ledger_event(assignment("job-3", shard_index=0, gpu_indices=(2,), term=8))
    assert book.state_of("node-a", at(1)).allocated_gpus == (0, 2)


def test_release_of_nothing_changes_nothing() -> None:
    book = alive_book()

    assert book.on_ledger_event(completed(shard_index=3), at(1)) == []


def test_lost_node_drops_its_reservations() -> None:
    book = alive_book()
    book.on_ledger_event(assignment(shard_index=0))

    state, _ = book.tick(at(10))

    assert isinstance(state, NodeState) and state.allocated_gpus == ()


def test_restore_from_node_state() -> None:
    book = PoolBook()
    saved = node_state("node-a", status=NodeStatus.SUSPECT, last_heartbeat_at=at(5), cpu_load=0.7)

    book.restore(saved)

    state = book.state_of("node-a", at(6))
    assert (state.status, state.last_heartbeat_at, state.cpu_load) == (NodeStatus.SUSPECT, at(5), 0.7)
    assert (state.gpus, state.address, state.agent_instance) == (saved.gpus, saved.address, saved.agent_instance)
    assert statuses(book.tick(at(15))) == [("NodeState", NodeStatus.LOST), ("NodeLost", "node-a")]
    (alive,) = book.on_heartbeat(heartbeat("node-a", seq=1), at(16))
    assert isinstance(alive, NodeState) and alive.status is NodeStatus.ALIVE


# --- artifacts, topology and drain -------------------------------------------------------------------------------
ARTIFACTS: dict[str, ArtifactPlace] = {"/data/models/gpt2": "local", "/data/datasets/wikitext": "shared"}
TOPOLOGY = {"zone": "eu-1", "rack": "r7"}


def drain(node_id: str = "node-a", draining: bool = True) -> NodeDrain:
    return NodeDrain(occurred_at=at(1), node_id=node_id, draining=draining)


def test_heartbeat_artifacts_and_topology_reach_the_node_state() -> None:
    (state,) = PoolBook().on_heartbeat(heartbeat(artifacts=ARTIFACTS, topology=TOPOLOGY), at(0))

    assert isinstance(state, NodeState)
    assert (state.artifacts, state.topology, state.draining) == (ARTIFACTS, TOPOLOGY, False)


def test_the_node_state_says_where_the_agent_mounts_job_paths_and_a_restore_keeps_it() -> None:
    mounts = {"/data": "/srv/run/data"}
    (state,) = PoolBook().on_heartbeat(heartbeat(mounts=mounts), at(0))
    assert isinstance(state, NodeState) and state.mounts == mounts

    book = PoolBook()
    book.restore(state)
    assert book.state_of("node-a", at(1)).mounts == mounts


def test_a_node_state_published_before_mounts_were_carried_still_reads() -> None:
    older = node_state("node-a").model_dump(mode="json")
    del older["mounts"]

    assert NodeState.model_validate(older).mounts == {}


def test_the_latest_heartbeat_says_which_artifacts_are_there() -> None:
    book = PoolBook()
    book.on_heartbeat(heartbeat(seq=1, artifacts=ARTIFACTS), at(0))

    (state,) = book.on_heartbeat(heartbeat(seq=2, artifacts={"/data/models/gpt2": "local"}), at(1))

    assert isinstance(state, NodeState) and state.artifacts == {"/data/models/gpt2": "local"}


@pytest.mark.parametrize(
    ("requests", "published", "draining"),
    [
        pytest.param([True], [True], True, id="drain"),
        pytest.param([True, True], [True], True, id="second-drain-changes-nothing"),
        pytest.param([True, False], [True, False], False, id="drain-then-undo"),
        pytest.param([False], [], False, id="undo-of-an-undrained-node"),
    ],
)
def test_drain_publishes_the_node_state_at_once(requests: list[bool], published: list[bool], draining: bool) -> None:
    book = alive_book()

    out = [state for request in requests for state in book.on_drain(drain(draining=request), at(1))]

    assert [(s.node_id, s.draining, s.occurred_at) for s in out] == [("node-a", d, at(1)) for d in published]  # type: ignore[attr-defined]
    assert book.state_of("node-a", at(2)).draining is draining


def test_drain_of_an_unknown_node_is_ignored() -> None:
    book = alive_book()

    assert book.on_drain(drain("node-z"), at(1)) == []
    assert "node-z" not in book.nodes


@pytest.mark.parametrize(
    "beat",
    [
        pytest.param(heartbeat(seq=1), id="next-heartbeat"),
        pytest.param(heartbeat(seq=0, agent_instance="node-a-agent-2"), id="restarted-agent"),
    ],
)
def test_drain_outlives_heartbeats(beat: Heartbeat) -> None:
    book = alive_book()
    book.on_drain(drain(), at(1))

    (state,) = book.on_heartbeat(beat, at(2))

    assert isinstance(state, NodeState) and state.draining is True


def test_a_silent_draining_node_stays_draining() -> None:
    book = alive_book()
    book.on_drain(drain(), at(1))

    (suspect,) = book.tick(at(4))

    assert isinstance(suspect, NodeState) and (suspect.status, suspect.draining) == (NodeStatus.SUSPECT, True)


def test_restore_keeps_drain_artifacts_and_topology() -> None:
    book = PoolBook()
    book.restore(node_state("node-a", draining=True, artifacts=ARTIFACTS, topology=TOPOLOGY))

    state = book.state_of("node-a", at(1))
    assert (state.draining, state.artifacts, state.topology) == (True, ARTIFACTS, TOPOLOGY)
    (after,) = book.on_heartbeat(heartbeat("node-a", seq=1), at(2))
    assert isinstance(after, NodeState) and after.draining is True
    (undrained,) = book.on_drain(drain(draining=False), at(3))
    assert isinstance(undrained, NodeState) and undrained.draining is False


@pytest.mark.parametrize(
    ("sent_at", "check_every_s", "quiet_at", "suspect_at"),
    [
        pytest.param(0.0, 0.0, 2.99, 3.0, id="sent-as-received"),
        pytest.param(-0.3, 0.0, 2.69, 2.7, id="silence-runs-from-the-sending"),
        pytest.param(-4.0, 0.0, 2.49, 2.5, id="a-clock-far-behind-counts-for-half-a-second-at-most"),
        pytest.param(2.0, 0.0, 2.99, 3.0, id="a-clock-ahead-counts-from-the-receipt"),
        pytest.param(0.0, 0.1, 2.89, 2.9, id="a-check-every-100ms-is-never-late"),
    ],
)
def test_silence_is_counted_from_the_last_heartbeats_sending(
    sent_at: float, check_every_s: float, quiet_at: float, suspect_at: float
) -> None:
    book = PoolBook(suspect_after_s=3.0, lost_after_s=10.0, check_every_s=check_every_s)
    book.on_heartbeat(heartbeat("node-a", occurred_at=at(sent_at)), at(0))

    assert book.tick(at(quiet_at)) == []
    assert statuses(book.tick(at(suspect_at))) == [("NodeState", NodeStatus.SUSPECT)]


def test_a_beat_is_believed_once_and_the_pool_rebuilt_from_its_states_remembers_the_newest() -> None:
    book = PoolBook(suspect_after_s=3.0, lost_after_s=10.0)
    book.on_heartbeat(heartbeat("node-a", seq=1, occurred_at=at(0)), at(0))
    captured = lease_of(heartbeat("node-a", seq=2, occurred_at=at(1)))
    book.on_lease(captured, at(1))
    for t in (2, 3, 4):  # the agent frozen, its last lease played back once a second
        book.on_lease(captured, at(t))
    assert statuses(book.tick(at(4.0))) == [("NodeState", NodeStatus.SUSPECT)]

    (state,) = [e for e in alive_book().on_heartbeat(heartbeat("node-a", seq=9), at(0)) if isinstance(e, NodeState)]
    rebuilt = PoolBook(suspect_after_s=3.0, lost_after_s=10.0)
    rebuilt.restore(state)
    assert state.last_beat_seq == 9
    assert rebuilt.on_lease(lease_of(heartbeat("node-a", seq=9)), at(1)) == []
    assert rebuilt.nodes["node-a"].received_at == state.last_heartbeat_at


def test_a_node_whose_agent_reported_stalls_is_suspected_later_by_its_margin_and_lost_on_time() -> None:
    book = PoolBook(suspect_after_s=3.0, lost_after_s=10.0)
    book.on_heartbeat(heartbeat("node-a", occurred_at=at(0)), at(0))
    book.on_lease(lease_of(heartbeat("node-a", seq=1, occurred_at=at(1), margin_s=2.0)), at(1))

    assert book.tick(at(5.9)) == []  # 4.9 s of silence: a loaded host's agent, late by less than its margin
    assert statuses(book.tick(at(6.0))) == [("NodeState", NodeStatus.SUSPECT)]
    assert statuses(book.tick(at(11.0))) == [("NodeState", NodeStatus.LOST), ("NodeLost", "node-a")]


def test_a_margin_is_capped_and_a_calm_beat_takes_it_back() -> None:
    book = PoolBook(suspect_after_s=3.0, lost_after_s=10.0)
    book.on_heartbeat(heartbeat("node-a", margin_s=60.0), at(0))
    assert statuses(book.tick(at(3.0 + MAX_MARGIN_S))) == [("NodeState", NodeStatus.SUSPECT)]
    book.on_heartbeat(heartbeat("node-a", seq=1, occurred_at=at(8)), at(8))
    assert statuses(book.tick(at(11.0))) == [("NodeState", NodeStatus.SUSPECT)]


# Replicas split the nodes by heartbeats partition.


def _on_two_partitions() -> tuple[str, str]:
    """Two node ids whose heartbeats land on different partitions."""
    first = "node-a"
    other = next(
        f"node-{i}" for i in range(100) if partition_of(f"node-{i}", HEARTBEATS) != partition_of(first, HEARTBEATS)
    )
    return first, other


def test_a_replica_judges_and_publishes_only_the_nodes_of_its_partitions() -> None:
    mine, theirs = _on_two_partitions()
    book = alive_book(mine, theirs)
    book.assign([partition_of(mine, HEARTBEATS)], at(0))

    assert [e.node_id for e in book.tick(at(4)) if isinstance(e, NodeState)] == [mine]  # type: ignore[attr-defined]
    assert book.state_of(theirs, at(4)).status is NodeStatus.ALIVE  # the other replica's to judge
    published = book.on_ledger_event(assignment(node_id=theirs, gpu_indices=(1,)), at(4))
    assert published == [] and book.state_of(theirs, at(4)).allocated_gpus == (1,)  # kept, not published


def test_a_replica_keeps_the_states_the_others_publish_of_their_nodes_only() -> None:
    mine, theirs = _on_two_partitions()
    book = alive_book(mine, theirs)
    book.assign([partition_of(mine, HEARTBEATS)], at(0))

    book.observe(node_state(theirs, status=NodeStatus.SUSPECT, draining=True))
    book.observe(node_state(mine, status=NodeStatus.LOST))

    assert book.state_of(theirs, at(1)).status is NodeStatus.SUSPECT and book.state_of(theirs, at(1)).draining
    assert book.state_of(mine, at(1)).status is NodeStatus.ALIVE  # this replica is the authority on its own


def test_nodes_taken_over_get_a_fresh_silence_window() -> None:
    mine, theirs = _on_two_partitions()
    book = alive_book(mine, theirs)  # both last heard at 0
    book.assign([partition_of(mine, HEARTBEATS)], at(0))
    book.tick(at(2.9))

    # The other replica died: a rebalance gives this one every partition (the group stopped its reading meanwhile).
    book.assign([partition_of(mine, HEARTBEATS), partition_of(theirs, HEARTBEATS)], at(2.9))

    assert book.tick(at(3.0)) == []  # the heartbeats since the rebalance began are still to be read
    assert book.tick(at(3.9)) == []  # 1 s to catch up after the takeover: past it, neither partition has been
    # read up to the present (no heartbeat sent since the takeover read from it)
    assert [book.tick(at(4.0 + 0.5 * i)) for i in range(4)] == [[]] * 4  # up to 5.5
    suspected = {e.node_id for e in book.tick(at(5.9)) if isinstance(e, NodeState)}  # type: ignore[attr-defined]
    assert suspected == {mine, theirs}  # a whole suspicion window of this replica's own without a word


def test_a_partition_read_up_to_the_present_is_judged_again_at_once() -> None:
    mine, theirs = _on_two_partitions()
    neighbour = next(
        f"node-{i}"
        for i in range(200)
        if f"node-{i}" != mine and partition_of(f"node-{i}", HEARTBEATS) == partition_of(mine, HEARTBEATS)
    )
    book = alive_book(mine, theirs, neighbour)  # all last heard at 0
    book.assign([partition_of(mine, HEARTBEATS), partition_of(theirs, HEARTBEATS)], at(2.9))
    book.on_heartbeat(heartbeat(neighbour, seq=1, occurred_at=at(1.0)), at(3.0))  # backlog: sent before it
    assert book.tick(at(3.9)) == []
    book.on_heartbeat(heartbeat(neighbour, seq=2, occurred_at=at(3.5)), at(3.95))  # sent since: read to the present

    suspected = {e.node_id for e in book.tick(at(4.0)) if isinstance(e, NodeState)}  # type: ignore[attr-defined]
    assert suspected == {mine}  # its partition is read up to now and it said nothing; theirs may still be unread
    suspected = {e.node_id for e in book.tick(at(5.9)) if isinstance(e, NodeState)}  # type: ignore[attr-defined]
    assert suspected == {theirs}


def test_a_replica_that_was_not_running_suspects_nobody_for_its_own_gap() -> None:
    book = alive_book()
    book.pause_after_s = 1.0
    book.tick(at(0.1))

    assert book.tick(at(5.0)) == []  # 4.9 s without a tick: paused, not the node (1 s to catch up)
    book.on_heartbeat(heartbeat(seq=1, occurred_at=at(0.5)), at(5.1))  # the backlog: sent long ago
    assert [book.tick(at(5.2 + 0.5 * i)) for i in range(6)] == [[]] * 6  # up to 7.7
    # Its silence counts from its sending, less at most 0.5 s of transit: from 4.6; but nothing sent since the pause
    # has been read from its partition, so it is judged a whole suspicion window after the pause.
    assert statuses(book.tick(at(8.0))) == [("NodeState", NodeStatus.SUSPECT)]


def test_a_replica_that_cannot_reach_its_broker_judges_no_silence_until_it_can_again() -> None:
    book = alive_book("node-a", "node-b")
    ticks = [book.tick(at(0.1 * i), blind=True) for i in range(1, 120)]  # 12 s of a broker down, ticking on

    assert ticks == [[]] * 119  # neither SUSPECT at 3 s nor LOST at 10 s: nothing could be read
    assert book.tick(at(12.0)) == []  # the broker answers again: a takeover's grace before anyone is judged
    for node_id in ("node-a", "node-b"):  # their fresh beats are read
        book.on_heartbeat(heartbeat(node_id, seq=2, occurred_at=at(12.1), gpus=gpus(count=4)), at(12.3))
    assert [book.tick(at(12.4 + 0.5 * i)) for i in range(4)] == [[]] * 4
    assert statuses(book.tick(at(15.5))) == [("NodeState", NodeStatus.SUSPECT)] * 2  # silent again past 3 s


def test_a_node_that_died_while_its_judge_was_cut_off_is_suspected_after_the_grace() -> None:
    book = alive_book("node-a")
    for i in range(1, 50):
        book.tick(at(0.1 * i), blind=True)

    assert book.tick(at(5.0)) == []
    assert statuses(book.tick(at(8.0))) == [("NodeState", NodeStatus.SUSPECT)]  # a whole window after
