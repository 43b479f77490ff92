"""The scheduler and full disks: a move off a full disk keeps the job's next attempt off the nodes that filled (its
shards there included: no survivor stays on a full disk), and only that attempt; a job whose every fitting node's disk
is below the floor waits with DISK_FULL, naming them, and starts once one has room."""

from __future__ import annotations

from shardyard.events import (
    DiskSpace,
    Event,
    FailureCause,
    JobReady,
    JobRecovering,
    JobScheduled,
    JobUnschedulable,
    PendingReason,
)
from shardyard.scheduler.book import SchedulerBook
from tests.unit.builders import GIB, at, gpus, job_spec, node_state, started


def of(events: list[Event], kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind)]


def disk(free: int) -> DiskSpace:
    return DiskSpace(path="/data/checkpoints", free_bytes=free, total_bytes=100 * GIB)


def cluster(**free: int) -> SchedulerBook:
    book = SchedulerBook()
    for node_id, space in free.items():
        book.apply(node_state(node_id, gpus=gpus(count=1), output_disk=disk(space)))
    return book


def ready(book: SchedulerBook, shards: int = 2) -> None:
    spec = job_spec(memory_bytes=0, cpu_cores=1.0, gpu_count=shards, shard_count=shards)
    book.apply(JobReady(occurred_at=at(0), job_id="job-1", spec=spec))


def moved_off(*full: str, attempt: int = 1, when: float = 10.0) -> JobRecovering:
    return JobRecovering(
        occurred_at=at(when),
        job_id="job-1",
        attempt=attempt,
        cause=FailureCause.DISK_FULL,
        message="moving off the full disk",
        avoid_nodes=full,
        retry_at=at(when),
        retries_used=0,
        retries_left=3,
        counted=False,
    )


def test_a_move_off_a_full_disk_re_forms_the_gang_off_it_for_the_next_attempt_only() -> None:
    book = cluster(n1=10 * GIB, n2=10 * GIB, n3=10 * GIB)
    ready(book)
    (first,) = of(book.cycle(at(3)), JobScheduled)
    for shard in range(2):
        book.apply(started("job-1", shard))
    full = first.placements[0].node_id

    (second,) = of(book.on_recovering(moved_off(full), at(10)), JobScheduled)

    assert full not in {p.node_id for p in second.placements}
    assert second.attempt == 2
    assert full not in book.exclusions.of(
        "job-1", book.nodes[full].occurred_at
    )  # not kept off for good: the disk may be cleaned up


def test_a_job_waits_with_disk_full_naming_the_disks_then_starts_where_there_is_room() -> None:
    book = cluster(n1=GIB // 2, n2=0)
    ready(book)

    (waiting,) = of(book.cycle(at(3)), JobUnschedulable)
    book.apply(node_state("n2", gpus=gpus(count=1), output_disk=disk(5 * GIB), occurred_at=at(4)))
    book.apply(node_state("n1", gpus=gpus(count=1), output_disk=disk(5 * GIB), occurred_at=at(4)))
    (placed,) = of(book.cycle(at(5)), JobScheduled)

    assert waiting.reason is PendingReason.DISK_FULL
    assert waiting.node_counts == {"output disk below 1GiB free": 2}
    assert waiting.message.endswith("output disks below 1GiB free: n1 (512MiB free), n2 (0B free)")
    assert sorted(p.node_id for p in placed.placements) == ["n1", "n2"]
