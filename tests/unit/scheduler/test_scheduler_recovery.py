"""The scheduler book carries out recovery plans: requeue with exclusions and backoff, resume from the last
checkpoint, spares placed with gangs and promoted at once when a gang node is lost."""

from __future__ import annotations

from datetime import timedelta

from shardyard.events import (
    Event,
    FailureCause,
    JobReady,
    JobRecovering,
    JobScheduled,
    JobUnschedulable,
    NodeStatus,
    PendingReason,
    ShardAssignment,
    ShardCheckpointed,
    ShardRevocation,
)
from shardyard.scheduler.book import SchedulerBook
from tests.unit.builders import at, completed, gpus, job_spec, node_state, redundancy, started


def of(events: list[Event], kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind)]


def cluster(*nodes: str, ratio: float = 0.0) -> SchedulerBook:
    book = SchedulerBook()
    if ratio:
        book.apply(redundancy(ratio))
    for node_id in nodes:
        book.apply(node_state(node_id, gpus=gpus(count=1)))
    return book


def running(book: SchedulerBook) -> JobScheduled:
    book.apply(JobReady(occurred_at=at(0), job_id="job-1", spec=job_spec(memory_bytes=0, cpu_cores=1.0)))
    (scheduled,) = of(book.cycle(at(3)), JobScheduled)  # past the spare grace
    for shard in range(2):
        book.apply(started("job-1", shard))
    book.on_shard_event(at(4))
    return scheduled


def plan(attempt: int = 1, exclude: tuple[str, ...] = (), retry_in: float = 0.0, when: float = 10.0) -> JobRecovering:
    return JobRecovering(
        occurred_at=at(when),
        job_id="job-1",
        attempt=attempt,
        cause=FailureCause.NODE_LOST,
        message="lost",
        exclude_nodes=exclude,
        retry_at=at(when) + timedelta(seconds=retry_in),
        retries_used=1,
        retries_left=2,
    )


def test_recovery_stops_the_gang_and_replaces_the_lost_shard_at_once_keeping_the_survivor() -> None:
    book = cluster("n1", "n2", "n3")
    first = running(book)
    survivor, lost = (p.node_id for p in first.placements)
    book.apply(
        ShardCheckpointed(
            occurred_at=at(5), job_id="job-1", shard_index=0, attempt=1, node_id="n1", step=200, checkpoint_dir="/c"
        )
    )

    events = book.on_recovering(plan(exclude=(lost,)), at(10))

    assert sorted(r.shard_index for r in of(events, ShardRevocation)) == [0, 1]
    (second,) = of(events, JobScheduled)  # no placement cycle waited for
    assert second.attempt == 2 and second.resume_from == "/c"
    assert [p.node_id for p in second.placements] == [survivor, "n3"]  # the survivor keeps its GPU, rank 0
    assert {a.workload.resume_from for a in of(events, ShardAssignment)} == {"/c"}
    assert (second.coordinator_node, second.rendezvous_port) != (first.coordinator_node, first.rendezvous_port)
    assert of(book.cycle(at(10)), JobScheduled) == []


def test_a_failure_that_excludes_no_node_re_forms_the_gang_in_place() -> None:
    book = cluster("n1", "n2", "n3")
    first = running(book)

    events = book.on_recovering(plan(), at(10))

    (second,) = of(events, JobScheduled)
    assert [(p.node_id, p.gpu_indices) for p in second.placements] == [
        (p.node_id, p.gpu_indices) for p in first.placements
    ]
    assert second.attempt == 2


def test_a_lost_shard_with_no_free_gpu_requeues_the_job() -> None:
    book = cluster("n1", "n2")
    first = running(book)
    lost = first.placements[1].node_id

    events = book.on_recovering(plan(exclude=(lost,)), at(10))

    assert of(events, JobScheduled) == []  # nothing free off the excluded node: the job waits in the queue
    assert of(book.cycle(at(10)), JobScheduled) == []
    book.apply(node_state("n3", gpus=gpus(count=1)))
    (second,) = of(book.cycle(at(11)), JobScheduled)
    assert sorted(p.node_id for p in second.placements) == sorted({first.placements[0].node_id, "n3"})


def test_backoff_holds_the_retry_with_its_reason() -> None:
    book = cluster("n1", "n2", "n3")
    running(book)
    book.on_recovering(plan(retry_in=4.0), at(10))

    (waiting,) = book.cycle(at(12))
    later = book.cycle(at(14))

    assert isinstance(waiting, JobUnschedulable) and waiting.reason is PendingReason.RETRY_BACKOFF
    assert "2.0s" in waiting.message
    assert [e.attempt for e in of(later, JobScheduled)] == [2]


def test_a_plan_for_an_older_attempt_changes_nothing() -> None:
    book = cluster("n1", "n2")
    running(book)
    book.on_recovering(plan(), at(10))
    book.cycle(at(10))

    assert book.on_recovering(plan(attempt=1, when=11), at(11)) == []
    assert book.gangs["job-1"].scheduled.attempt == 2


def test_excluded_nodes_accumulate_over_recoveries() -> None:
    book = cluster("n1", "n2", "n3", "n4")
    running(book)
    (second,) = of(book.on_recovering(plan(exclude=("n1",)), at(10)), JobScheduled)
    (third,) = of(book.on_recovering(plan(attempt=2, exclude=("n2",), when=20), at(20)), JobScheduled)

    assert "n1" not in {p.node_id for p in second.placements}
    assert {p.node_id for p in third.placements} == {"n3", "n4"}


def test_spares_are_placed_with_the_gang_off_its_nodes() -> None:
    book = cluster("n1", "n2", "n3", ratio=0.1)

    scheduled = running(book)

    spares = [p for p in scheduled.placements if p.spare]
    assert len(spares) == 1 and spares[0].shard_index == 2
    assert spares[0].node_id not in {p.node_id for p in scheduled.placements if not p.spare}


def test_no_room_for_a_spare_does_not_hold_the_gang_back() -> None:
    book = cluster("n1", "n2", ratio=0.5)

    scheduled = running(book)

    assert [p.spare for p in scheduled.placements] == [False, False]


def test_a_lost_node_promotes_the_spare_at_once() -> None:
    book = cluster("n1", "n2", "n3", ratio=0.1)
    first = running(book)
    (spare,) = [p for p in first.placements if p.spare]
    lost = first.placements[1].node_id
    book.apply(node_state(lost, gpus=gpus(count=1), status=NodeStatus.SUSPECT))

    events = book.on_recovering(plan(exclude=(lost,)), at(10))

    (second,) = of(events, JobScheduled)
    assert second.attempt == 2
    assert sorted(p.node_id for p in second.placements) == sorted({first.placements[0].node_id, spare.node_id})
    assert not any(p.spare for p in second.placements)
    trained = [a for a in of(events, ShardAssignment) if not a.spare]
    assert len(trained) == 2 and {a.world_size for a in trained} == {2}


def test_spares_are_released_when_the_job_succeeds() -> None:
    book = cluster("n1", "n2", "n3", ratio=0.1)
    scheduled = running(book)
    for shard in range(2):
        book.apply(completed("job-1", shard))

    events = book.on_shard_event(at(30))

    (released,) = of(events, ShardRevocation)
    assert released.shard_index == 2 and released.node_id == next(p for p in scheduled.placements if p.spare).node_id


def test_a_new_gang_waits_briefly_for_room_for_its_spares_then_goes_without() -> None:
    book = cluster("n1", "n2", ratio=0.5)
    book.apply(JobReady(occurred_at=at(0), job_id="job-1", spec=job_spec(memory_bytes=0, cpu_cores=1.0)))

    assert of(book.cycle(at(1)), JobScheduled) == []
    book.apply(node_state("n3", gpus=gpus(count=1)))
    (with_spare,) = of(book.cycle(at(1.5)), JobScheduled)

    assert [p.spare for p in with_spare.placements] == [False, False, True]


def test_after_the_spare_grace_the_gang_starts_without_spares() -> None:
    book = cluster("n1", "n2", ratio=0.5)
    book.apply(JobReady(occurred_at=at(0), job_id="job-1", spec=job_spec(memory_bytes=0, cpu_cores=1.0)))

    (scheduled,) = of(book.cycle(at(2)), JobScheduled)

    assert [p.spare for p in scheduled.placements] == [False, False]


def test_a_duplicated_plan_or_release_changes_nothing() -> None:
    """A replica of the fault manager or the queue that was paused past its group's session can publish, as it
    resumes, a decision its successor also made: a second plan for the same failed attempt, a second release of a
    job. The scheduler carries out the first and ignores the second."""
    book = cluster("n1", "n2", "n3")
    first = running(book)
    lost = first.placements[1].node_id
    (second,) = of(book.on_recovering(plan(exclude=(lost,)), at(10)), JobScheduled)

    assert book.on_recovering(plan(exclude=(lost,), when=10.5), at(10.5)) == []
    book.apply(JobReady(occurred_at=at(11), job_id="job-1", spec=job_spec(memory_bytes=0, cpu_cores=1.0)))
    assert of(book.cycle(at(12)), JobScheduled) == []
    assert book.gangs["job-1"].scheduled == second


def test_an_exclusion_ends_once_the_node_has_been_alive_a_while_and_the_wait_says_until_when() -> None:
    book = cluster("n1", "n2")
    first = running(book)
    lost = first.placements[1].node_id
    book.apply(node_state(lost, gpus=gpus(count=1), status=NodeStatus.SUSPECT, occurred_at=at(9)))  # a gap
    book.on_recovering(plan(exclude=(lost,)), at(10))
    book.apply(node_state(lost, gpus=gpus(count=1), occurred_at=at(12)))  # back: the fault was transient

    (waiting,) = of(book.cycle(at(13)), JobUnschedulable)
    assert f"excluded after a failure: {lost} until 00:02:12 UTC if it stays ALIVE" in waiting.message
    assert of(book.cycle(at(131)), JobScheduled) == []
    (second,) = of(book.cycle(at(132)), JobScheduled)  # ALIVE for 120 s since its return: usable again
    assert lost in {p.node_id for p in second.placements}


def test_a_node_that_stays_down_stays_excluded_and_one_that_fails_again_is_excluded_again() -> None:
    book = cluster("n1", "n2", "n3")
    first = running(book)
    lost = first.placements[1].node_id
    book.apply(node_state(lost, gpus=gpus(count=1), status=NodeStatus.LOST, occurred_at=at(9)))
    (second,) = of(book.on_recovering(plan(exclude=(lost,)), at(10)), JobScheduled)
    assert lost not in {p.node_id for p in second.placements}
    assert lost in book.exclusions.of("job-1", at(1_000))  # never ALIVE since: still kept off
    book.apply(node_state(lost, gpus=gpus(count=1), occurred_at=at(1_000)))
    assert lost in book.exclusions.of("job-1", at(1_119)) and lost not in book.exclusions.of("job-1", at(1_120))
