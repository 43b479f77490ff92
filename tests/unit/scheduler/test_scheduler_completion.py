"""What a gang's shard facts add up to (``completion.settle``), and where a preempted gang resumes from."""

from __future__ import annotations

from shardyard.events import (
    JobPreempted,
    JobRunning,
    JobSucceeded,
    RevocationReason,
    ShardPreempted,
    ShardRevocation,
)
from shardyard.events.job import Elasticity
from shardyard.scheduler import preemption
from shardyard.scheduler.completion import settle
from shardyard.scheduler.gang import Gang
from tests.unit.builders import at, completed, job_spec, placement, scheduled


def gang(*, spare: bool = False) -> Gang:
    """job-1's attempt 1: two training shards on node-a (and a spare on node-b)."""
    placements = (placement(0), placement(1), *([placement(2, "node-b").model_copy(update={"spare": True})] * spare))
    return Gang(job_spec(), scheduled(placements=placements))


def stopped(shard: int, checkpoint: str | None = "/c/rank", step: int | None = 40) -> ShardPreempted:
    return ShardPreempted(
        occurred_at=at(5),
        job_id="job-1",
        shard_index=shard,
        attempt=1,
        node_id="node-a",
        step=step,
        checkpoint_dir=checkpoint,
    )


def kinds(events: list[object]) -> list[str]:
    return [type(e).__name__ for e in events]


def test_nothing_while_the_gang_is_on_its_way() -> None:
    partial = gang()
    partial.started.add(0)
    partial.completed[0] = completed(shard_index=0)

    assert settle(partial, resume_from=None, term=3, now=at(5)) == []


def test_all_started_is_running_once() -> None:
    running = gang()
    running.started.update({0, 1})

    (event,) = settle(running, resume_from=None, term=3, now=at(5))
    running.running = True  # as the book takes the event in

    assert isinstance(event, JobRunning) and (event.job_id, event.attempt) == ("job-1", 1)
    assert settle(running, resume_from=None, term=3, now=at(6)) == []


def test_all_completed_at_once_is_running_then_spares_released_then_succeeded_with_rank_0s_result() -> None:
    done = gang(spare=True)
    done.started.update({0, 1})
    done.completed[1] = completed(shard_index=1, final_loss=3.0, checkpoint_dir="/c/1")
    done.completed[0] = completed(shard_index=0, final_loss=2.5, checkpoint_dir="/c/0")

    events = settle(done, resume_from=None, term=3, now=at(9))

    assert kinds(events) == ["JobRunning", "ShardRevocation", "JobSucceeded"]
    revocation, success = events[1], events[2]
    assert isinstance(revocation, ShardRevocation) and isinstance(success, JobSucceeded)
    assert (revocation.shard_index, revocation.reason, revocation.term) == (2, RevocationReason.JOB_SUCCEEDED, 3)
    assert (success.final_loss, success.checkpoint_dir) == (2.5, "/c/0")


def test_all_stopped_or_completed_is_preempted() -> None:
    victim = gang()
    victim.preempted_by = "vip"
    victim.completed[0] = completed(shard_index=0)
    victim.preempted[1] = stopped(1, "/c/1", step=40)

    (event,) = settle(victim, resume_from="/c/older", term=3, now=at(9))

    assert isinstance(event, JobPreempted)
    assert (event.by_job, event.checkpoint_dir, event.checkpoint_step) == ("vip", "/c/1", 40)


def test_a_preempted_gang_resumes_from_rank_0s_checkpoint_first() -> None:
    victim = gang()
    victim.preempted_by = "vip"
    victim.preempted[1] = stopped(1, "/c/1", step=30)
    victim.preempted[0] = stopped(0, "/c/0", step=40)

    event = preemption.preempted(victim, "/c/older", at(9))

    assert (event.checkpoint_dir, event.checkpoint_step) == ("/c/0", 40)
    assert preemption.all_stopped(victim)


def test_a_preempted_gang_without_a_new_checkpoint_resumes_from_its_last_one() -> None:
    victim = gang()
    victim.preempted[0] = stopped(0, checkpoint=None, step=None)

    unsaved = preemption.preempted(victim, "/c/older", at(9))
    overdue = preemption.preempted(gang(), "/c/older", at(9))  # the deadline passed with nothing stopped

    assert (unsaved.checkpoint_dir, unsaved.checkpoint_step, unsaved.by_job) == ("/c/older", None, "")
    assert (overdue.checkpoint_dir, overdue.checkpoint_step) == ("/c/older", None)
    assert not preemption.all_stopped(victim)


def test_an_elastic_gang_placed_below_its_preferred_size_runs_and_succeeds_at_the_size_it_was_placed() -> None:
    """An elastic job preferring 4 shards, placed at 2: its two shards are the whole gang."""
    spec = job_spec(gpu_count=4, elasticity=Elasticity(min_shards=2, max_shards=4))
    small = Gang(spec, scheduled(placements=(placement(0), placement(1))))
    small.started.update({0, 1})
    small.completed[0] = completed(shard_index=0)
    small.completed[1] = completed(shard_index=1)

    assert small.size == 2
    assert kinds(settle(small, resume_from=None, term=3, now=at(9))) == ["JobRunning", "JobSucceeded"]
