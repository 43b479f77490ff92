"""The scheduler resizes running elastic gangs: it grows them into GPUs no waiting job can use, and shrinks them to
make room for a job that may preempt them, instead of stopping them whole (``scheduler.resize``)."""

from __future__ import annotations

from shardyard.events import (
    Event,
    JobPreempting,
    JobReady,
    JobResized,
    JobScheduled,
    PendingReason,
    ResizeReason,
    RevocationReason,
    RunningShard,
    ShardAssignment,
    ShardRevocation,
    ShardStopRequest,
)
from shardyard.events.job import Elasticity
from shardyard.lifecycle import JobState, moves
from shardyard.scheduler.book import SchedulerBook
from shardyard.scheduler.resize import shrink_reason
from tests.unit.builders import at, gpus, job_spec, node_state, started


def ready(job_id: str, when: float = 0.0, **spec: object) -> JobReady:
    return JobReady(occurred_at=at(when), job_id=job_id, spec=job_spec(job_id=job_id, **spec))


def of(events: list[Event], kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind)]


def elastic(min_shards: int, preferred: int, max_shards: int, **spec: object) -> JobReady:
    sizes = Elasticity(min_shards=min_shards, max_shards=max_shards)
    return ready(
        "el", gpu_count=preferred, elasticity=sizes, memory_bytes=preferred * 2**30, cpu_cores=preferred, **spec
    )


def running(book: SchedulerBook, when: float, job_id: str = "el") -> JobScheduled:
    """Place ``job_id`` in a cycle at ``when`` and report every shard started."""
    (placed,) = [s for s in of(book.cycle(at(when)), JobScheduled) if s.job_id == job_id]
    for shard in placed.placements:
        book.apply(started(job_id, shard.shard_index, attempt=placed.attempt, node_id=shard.node_id))
    book.on_shard_event(at(when + 1))
    assert book.gangs[job_id].running
    return placed


def training(placed: JobScheduled) -> list[tuple[int, str, tuple[int, ...]]]:
    return [(p.shard_index, p.node_id, p.gpu_indices) for p in placed.placements if not p.spare]


def two_nodes(cooldown_s: float = 10.0) -> SchedulerBook:
    book = SchedulerBook(resize_cooldown_s=cooldown_s)
    book.apply(node_state("node-a", gpus=gpus(count=2)))
    book.apply(node_state("node-b", gpus=gpus(count=2)))
    return book


def test_a_running_elastic_gang_grows_into_free_gpus_keeping_its_shards_and_using_no_retry() -> None:
    book = two_nodes()
    book.apply(elastic(1, 2, 4))
    first = running(book, 1)
    assert len(training(first)) == 2

    events = book.cycle(at(20))

    (resized,) = of(events, JobResized)
    assert (resized.reason, resized.from_shards, resized.to_shards, resized.attempt) == (
        ResizeReason.GROW_INTO_IDLE,
        2,
        4,
        1,
    )
    revoked = of(events, ShardRevocation)
    assert {(r.shard_index, r.attempt, r.reason) for r in revoked} == {
        (0, 1, RevocationReason.RESIZING),
        (1, 1, RevocationReason.RESIZING),
    }
    (second,) = of(events, JobScheduled)
    assert second.attempt == 2 and len(training(second)) == 4
    assert training(second)[:2] == training(first)  # the kept shards stay on their GPUs, in their ranks
    assert {a.world_size for a in of(events, ShardAssignment)} == {4}
    assert {a.workload.global_batch for a in of(events, ShardAssignment)} == {2 * 8}  # preferred x batch_size
    assert events.index(revoked[-1]) < events.index(resized) < events.index(second)
    assert moves(JobState.RUNNING, resized) is JobState.READY


def test_a_gang_grows_only_once_its_attempt_is_past_the_cooldown() -> None:
    book = two_nodes(cooldown_s=30)
    book.apply(elastic(1, 2, 4))
    running(book, 1)

    assert of(book.cycle(at(20)), JobResized) == []
    assert len(of(book.cycle(at(32)), JobResized)) == 1


def test_the_cooldown_counts_from_when_every_shard_runs_not_from_the_placement() -> None:
    book = two_nodes(cooldown_s=10)
    book.apply(elastic(1, 2, 4))
    (placed,) = of(book.cycle(at(1)), JobScheduled)
    for shard in placed.placements:  # a slow start: the shards run 24 s after their placement
        book.apply(started("el", shard.shard_index, node_id=shard.node_id, occurred_at=at(25)))
    book.on_shard_event(at(25))

    assert of(book.cycle(at(30)), JobResized) == []
    assert len(of(book.cycle(at(36)), JobResized)) == 1


def test_a_gang_does_not_grow_while_a_job_that_could_use_the_gpus_waits() -> None:
    book = two_nodes()
    book.apply(elastic(2, 2, 4))
    running(book, 1)
    book.apply(ready("big", when=2, gpu_count=4))  # does not fit beside the gang, and may not preempt it

    assert of(book.cycle(at(20)), JobResized) == []


def test_a_job_of_another_gpu_model_does_not_hold_a_gang_back() -> None:
    book = two_nodes()
    book.apply(elastic(2, 2, 4))
    running(book, 1)
    book.apply(ready("h100", when=2, gpu_count=1, gpu_model="H100", min_tflops=0.0))

    assert len(of(book.cycle(at(20)), JobResized)) == 1


def test_a_gang_at_its_maximum_stays_as_it_is() -> None:
    book = two_nodes()
    book.apply(elastic(1, 2, 2))
    running(book, 1)

    assert of(book.cycle(at(20)), JobResized) == []


def one_node_of_four(**spec: object) -> tuple[SchedulerBook, JobScheduled]:
    book = SchedulerBook(resize_cooldown_s=10)
    book.apply(node_state("node-a", gpus=gpus(count=4)))
    book.apply(elastic(2, 4, 4, priority=1, **spec))
    return book, running(book, 1)


def test_a_higher_priority_job_shrinks_the_gang_to_make_room_instead_of_stopping_it() -> None:
    book, first = one_node_of_four()
    book.apply(ready("vip", when=10, priority=9, gpu_count=2))

    events = book.cycle(at(10))

    assert of(events, JobPreempting) == [] and of(events, ShardStopRequest) == []
    (resized,) = of(events, JobResized)
    assert (resized.reason, resized.from_shards, resized.to_shards, resized.by_job) == (
        ResizeReason.SHRINK_FOR_PREEMPTION,
        4,
        2,
        "vip",
    )
    (second,) = of(events, JobScheduled)
    assert training(second) == training(first)[:2]  # its core stays where it was
    # The GPUs it gave up go to the job it made room for, in the next cycle.
    (placed,) = of(book.cycle(at(11)), JobScheduled)
    assert placed.job_id == "vip"
    assert {g for p in placed.placements for g in p.gpu_indices} == {
        g for _i, _n, gpus_ in training(first)[2:] for g in gpus_
    }


def test_the_job_waits_for_the_shards_given_up_while_they_stop_and_preempts_nobody_meanwhile() -> None:
    book, first = one_node_of_four()
    book.apply(ready("vip", when=10, priority=9, gpu_count=2))
    book.cycle(at(10))
    gone = [p for p in first.placements if p.shard_index >= 2]
    # The node still runs the shards given up (their processes are stopping) and holds their GPUs.
    still = [RunningShard(job_id="el", shard_index=p.shard_index, attempt=1) for p in gone]
    held = tuple(g for p in first.placements for g in p.gpu_indices)
    book.apply(node_state("node-a", gpus=gpus(count=4), allocated_gpus=held, running=still, occurred_at=at(11)))

    waiting = book.cycle(at(11))

    assert of(waiting, JobPreempting) == [] and of(waiting, JobResized) == [] and of(waiting, JobScheduled) == []
    assert [(spec.job_id, reason) for spec, reason, _ in book.reasons.blocked] == [("vip", PendingReason.PREEMPTING)]
    kept = tuple(g for p in first.placements if p.shard_index < 2 for g in p.gpu_indices)
    book.apply(node_state("node-a", gpus=gpus(count=4), allocated_gpus=kept, occurred_at=at(12)))

    (placed,) = of(book.cycle(at(12)), JobScheduled)
    assert placed.job_id == "vip" and {g for p in placed.placements for g in p.gpu_indices} == set(held) - set(kept)


def test_the_core_up_to_min_shards_is_protected_even_when_the_job_is_not_preemptible() -> None:
    book, _ = one_node_of_four(preemptible=False)
    book.apply(ready("vip", when=10, priority=9, gpu_count=3))  # would need a core shard too

    events = book.cycle(at(10))

    assert of(events, JobResized) == [] and of(events, JobPreempting) == []


def test_a_quota_reclaim_by_another_queue_is_named_as_such() -> None:
    gang = job_spec(job_id="el", queue="research", priority=1)
    assert shrink_reason(gang, job_spec(job_id="t", queue="prod", priority=1)).name == "SHRINK_FOR_RECLAIM"
    assert shrink_reason(gang, job_spec(job_id="t", queue="prod", priority=5)).name == "SHRINK_FOR_PREEMPTION"
    assert shrink_reason(gang, job_spec(job_id="t", queue="research", priority=5)).name == "SHRINK_FOR_PREEMPTION"
