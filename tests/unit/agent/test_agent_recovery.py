"""The agent book's recovery decisions: spares are held, never run; a lost lease fences the running shards;
checkpoint reports become events naming the job path; sync-interval changes are noticed. Plus the lease rule."""

from __future__ import annotations

import pytest

from shardyard.events import FailureCause, ShardAssignment, ShardCompleted, ShardFailed, ShardPreempted
from shardyard.node_agent.book import AgentBook, Verdict, key_of
from shardyard.node_agent.fencing import fence_message, lease_expired
from tests.unit.agent.test_agent_book import revocation, stop_request
from tests.unit.builders import assignment, at, workload

SPARE = assignment(shard_index=2, spare=True)
SPARE_KEY = ("job-1", 2, 1)


@pytest.mark.parametrize(
    ("sequence", "expected"),
    [
        pytest.param([SPARE], [Verdict.HOLD_SPARE], id="held"),
        pytest.param([SPARE, SPARE], [Verdict.HOLD_SPARE, Verdict.DUPLICATE], id="redelivered"),
        pytest.param(
            [assignment(term=3), assignment(shard_index=2, term=2, spare=True)],
            [Verdict.LAUNCH, Verdict.STALE_TERM],
            id="stale-term",
        ),
        pytest.param([assignment(shard_index=2, node_id="node-b", spare=True)], [Verdict.NOT_MINE], id="not-mine"),
        pytest.param([SPARE, assignment(shard_index=2)], [Verdict.HOLD_SPARE, Verdict.LAUNCH], id="promoted-in-place"),
        pytest.param(
            [assignment(shard_index=2), assignment(shard_index=2, spare=True)],
            [Verdict.LAUNCH, Verdict.DUPLICATE],
            id="never-demoted",
        ),
    ],
)
def test_spare_assignments(sequence: list[ShardAssignment], expected: list[Verdict]) -> None:
    book = AgentBook("node-a")
    assert [book.on_assignment(a) for a in sequence] == expected


def test_a_spare_is_recorded_but_not_running() -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())
    book.on_assignment(SPARE)

    assert set(book.spares) == {SPARE_KEY}
    assert set(book.running) == {("job-1", 0, 1)}
    assert [r.shard_index for r in book.running_shards({})] == [0]
    assert book.gpu_utilization() == {0: 0.01}  # the spare's GPU 2 is not busy


def test_a_revoked_spare_is_dropped_and_nothing_is_stopped() -> None:
    book = AgentBook("node-a")
    book.on_assignment(SPARE)

    assert book.on_revocation(revocation(shard_index=2, term=0)) is None  # older term: kept
    assert SPARE_KEY in book.spares
    assert book.on_revocation(revocation(shard_index=2)) is None
    assert book.spares == {} and book.revoked == set()
    assert book.on_stop_request(stop_request(shard_index=2)) is None


def test_a_spare_promoted_in_place_runs_once() -> None:
    book = AgentBook("node-a")
    book.on_assignment(SPARE)
    book.on_assignment(assignment(shard_index=2))

    assert book.spares == {} and SPARE_KEY in book.running
    assert book.on_assignment(assignment(shard_index=2)) is Verdict.DUPLICATE
    assert book.on_assignment(SPARE) is Verdict.DUPLICATE


def test_fencing_marks_every_running_shard_once() -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment(shard_index=1))
    book.on_assignment(assignment(shard_index=0))
    book.on_assignment(SPARE)

    assert book.fence("self-fenced: bus unreachable for 6.0 s") == [("job-1", 0, 1), ("job-1", 1, 1)]
    assert book.fence("self-fenced: bus unreachable for 6.5 s") == []  # already being stopped
    book.on_assignment(assignment(shard_index=3))
    assert book.fence("self-fenced: bus unreachable for 7.0 s") == [("job-1", 3, 1)]
    assert SPARE_KEY in book.spares


@pytest.mark.parametrize(
    ("returncode", "kind"),
    [
        pytest.param(-15, ShardFailed, id="sigterm"),
        pytest.param(-9, ShardFailed, id="sigkill-after-the-grace"),
        pytest.param(4, ShardFailed, id="its-peer-went-first"),
        pytest.param(0, ShardCompleted, id="finished-just-in-time"),
        pytest.param(75, ShardPreempted, id="preempted-just-in-time"),
    ],
)
def test_a_fenced_shard_ends_fenced_unless_it_completed(returncode: int, kind: type) -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())
    book.fence("self-fenced: bus unreachable for 6.2 s")

    event = book.finished(("job-1", 0, 1), returncode, now=at(9), final=None, message=f"exit code {returncode}")

    assert isinstance(event, kind)
    if isinstance(event, ShardFailed):
        assert (event.cause, event.exit_code) == (FailureCause.FENCED, returncode)
        assert event.message == "self-fenced: bus unreachable for 6.2 s"
    assert book.fenced == {}


def test_a_fenced_shard_whose_job_was_revoked_reports_nothing() -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())
    book.on_revocation(revocation())
    book.fence("self-fenced")

    assert book.finished(("job-1", 0, 1), -15, now=at(9), final=None, message="") is None


def test_a_checkpoint_report_names_the_job_path() -> None:
    book = AgentBook("node-a")
    shard = assignment(workload=workload(output_path="/data/checkpoints/job-1"))
    book.on_assignment(shard)
    report = {"kind": "checkpointed", "step": 40, "checkpoint_dir": "/srv/data/checkpoints/job-1/checkpoint"}

    event = book.checkpointed(key_of(shard), report, now=at(3))

    assert event is not None
    assert (event.job_id, event.shard_index, event.attempt, event.node_id, event.occurred_at) == (
        "job-1",
        0,
        1,
        "node-a",
        at(3),
    )
    assert (event.step, event.checkpoint_dir) == (40, "/data/checkpoints/job-1/checkpoint")


@pytest.mark.parametrize(
    "report",
    [
        pytest.param({"kind": "checkpointed"}, id="no-step"),
        pytest.param({"kind": "checkpointed", "step": "40"}, id="string-step"),
        pytest.param({"kind": "checkpointed", "step": True}, id="bool-step"),
        pytest.param({"kind": "checkpointed", "step": -1}, id="negative-step"),
    ],
)
def test_a_malformed_checkpoint_report_is_ignored(report: dict[str, object]) -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())

    assert book.checkpointed(("job-1", 0, 1), report, now=at(3)) is None
    assert book.checkpointed(("job-9", 0, 1), {"step": 10}, now=at(3)) is None  # not running here


def test_sync_interval_changes_are_noticed_once() -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())
    key = ("job-1", 0, 1)

    seen = [book.pace(key, {"sync_interval": n}) for n in (10, 10, 20, 20, 40)]

    assert seen == [None, None, (10, 20), None, (20, 40)]
    assert book.pace(key, {"step": 5}) is None  # an older runner reports no interval
    book.finished(key, 0, now=at(9), final=None, message="")
    assert book.sync_intervals == {}


@pytest.mark.parametrize(
    ("now", "last_ok", "fenced"),
    [
        pytest.param(100.0, 100.0, False, id="just-renewed"),
        pytest.param(105.9, 100.0, False, id="within-the-lease"),
        pytest.param(106.0, 100.0, True, id="at-the-lease"),
        pytest.param(130.0, 100.0, True, id="long-gone"),
    ],
)
def test_lease_expired(now: float, last_ok: float, fenced: bool) -> None:
    assert lease_expired(now, last_ok, lease_s=6.0) is fenced


def test_fence_message() -> None:
    assert fence_message(6.04) == "self-fenced: bus unreachable for 6.0 s"
