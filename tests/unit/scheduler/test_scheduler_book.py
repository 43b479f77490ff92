from __future__ import annotations

from shardyard.events import (
    CapacityRequested,
    Event,
    FailureCause,
    JobFailed,
    JobReady,
    JobRunning,
    JobScheduled,
    JobSucceeded,
    JobUnschedulable,
    NodeStatus,
    PendingReason,
    ReclaimCandidate,
    ShardAssignment,
    ShardRevocation,
)
from shardyard.scheduler.book import SchedulerBook
from tests.unit.builders import at, completed, gpus, job_spec, node_state, started

V100S = gpus("V100", 2, 15.0)


def book_with(*nodes: str, term: int = 3, gpu_count: int = 2) -> SchedulerBook:
    book = SchedulerBook(term=term)
    for node_id in nodes:
        book.apply(node_state(node_id, gpus=gpus(count=gpu_count)))
    return book


def ready(job_id: str = "job-1", **overrides: object) -> JobReady:
    return JobReady(occurred_at=at(0), job_id=job_id, spec=job_spec(job_id=job_id, **overrides))


def lifecycle(events: list[Event]) -> list[Event]:
    """The cycle's events without the elasticity signals (tested on their own)."""
    return [e for e in events if not isinstance(e, CapacityRequested | ReclaimCandidate)]


def free_gpus(book: SchedulerBook) -> dict[str, tuple[int, ...]]:
    return {view.node_id: view.free_gpus for view in book.snapshot().nodes}


def placed(book: SchedulerBook, job_id: str = "job-1") -> tuple[JobScheduled, list[ShardAssignment]]:
    book.apply(ready(job_id))
    scheduled, *assignments = book.cycle(at(1))
    assert isinstance(scheduled, JobScheduled)
    assert all(isinstance(a, ShardAssignment) for a in assignments)
    return scheduled, assignments  # type: ignore[return-value]


def test_cycle_schedules_a_ready_job_with_one_assignment_per_shard() -> None:
    book = book_with("node-a")
    book.apply(ready(max_steps=40, batch_size=4, seq_len=32, lr=0.01, seed=7, sync_interval=10))

    scheduled, *assignments = book.cycle(at(1))

    assert isinstance(scheduled, JobScheduled)
    assert (scheduled.job_id, scheduled.attempt, scheduled.term) == ("job-1", 1, 3)
    assert (scheduled.coordinator_node, scheduled.rendezvous_port) == ("node-a", 29500)
    assert [p.shard_index for p in scheduled.placements] == [0, 1]
    assert len(assignments) == 2
    for index, assignment in enumerate(assignments):
        assert isinstance(assignment, ShardAssignment)
        assert (assignment.shard_index, assignment.world_size, assignment.node_id) == (index, 2, "node-a")
        assert (assignment.attempt, assignment.term) == (1, 3)
        assert (assignment.master_addr, assignment.master_port) == ("node-a.cluster", 29500)
        assert assignment.gpu_indices == scheduled.placements[index].gpu_indices
        workload = assignment.workload
        assert (workload.model_path, workload.dataset_path) == ("/data/models/gpt2", "/data/datasets/wikitext")
        assert workload.output_path == "/data/checkpoints/job-1"
        assert (workload.max_steps, workload.batch_size, workload.seq_len) == (40, 4, 32)
        assert (workload.lr, workload.seed, workload.sync_interval) == (0.01, 7, 10)
    assert free_gpus(book) == {"node-a": ()}


def test_nothing_new_means_nothing_emitted() -> None:
    book = book_with("node-a")
    placed(book)

    assert book.cycle(at(2)) == []
    assert book.cycle(at(3)) == []


def test_jobs_on_one_coordinator_get_distinct_ports_in_one_cycle() -> None:
    book = book_with("node-a", gpu_count=4)
    book.apply(ready("job-1"))
    book.apply(ready("job-2"))

    events = book.cycle(at(1))

    ports = [(e.coordinator_node, e.rendezvous_port) for e in events if isinstance(e, JobScheduled)]
    assert ports == [("node-a", 29500), ("node-a", 29501)]
    gpus_used = [a.gpu_indices for a in events if isinstance(a, ShardAssignment)]
    assert sorted(gpus_used) == [(0,), (1,), (2,), (3,)]


def test_jobs_on_one_coordinator_get_distinct_ports_across_cycles() -> None:
    book = book_with("node-a", gpu_count=4)
    first, _ = placed(book, "job-1")
    second, _ = placed(book, "job-2")

    assert (first.rendezvous_port, second.rendezvous_port) == (29500, 29501)


def test_unschedulable_is_emitted_once_per_reason() -> None:
    book = SchedulerBook()
    book.apply(node_state("node-v", gpus=V100S))
    book.apply(node_state("node-a", status=NodeStatus.LOST))  # the job's kind is there, down (else: NEVER_FITS)
    book.apply(ready())

    (first,) = lifecycle(book.cycle(at(1)))
    again = lifecycle(book.cycle(at(2)))
    book.apply(node_state("node-v", gpus=V100S, status=NodeStatus.LOST))
    (changed,) = lifecycle(book.cycle(at(3)))
    book.apply(node_state("node-a"))
    after_fit = book.cycle(at(4))

    assert isinstance(first, JobUnschedulable) and first.reason is PendingReason.GPU_MODEL_MISMATCH
    assert first.node_counts == {"GPU model mismatch": 1, "node not alive": 1}
    assert again == []
    assert isinstance(changed, JobUnschedulable) and changed.reason is PendingReason.NO_FIT
    assert [type(e) for e in after_fit] == [JobScheduled, ShardAssignment, ShardAssignment]


def test_no_nodes_is_unschedulable() -> None:
    book = SchedulerBook()
    book.apply(ready())

    (event,) = lifecycle(book.cycle(at(1)))

    assert isinstance(event, JobUnschedulable) and event.reason is PendingReason.NO_NODES


def test_node_reservations_from_the_pool_are_respected() -> None:
    book = SchedulerBook()
    book.apply(node_state("node-a", gpus=gpus(count=3), allocated_gpus=(0, 2)))

    assert free_gpus(book) == {"node-a": (1,)}


def test_all_shards_started_emits_running_once() -> None:
    book = book_with("node-a")
    placed(book)

    book.apply(started(shard_index=0))
    after_one = book.on_shard_event(at(2))
    book.apply(started(shard_index=1))
    after_two = book.on_shard_event(at(3))
    book.apply(started(shard_index=1))
    after_redelivery = book.on_shard_event(at(4))

    assert after_one == []
    assert [(type(e), e.job_id, e.attempt) for e in after_two] == [(JobRunning, "job-1", 1)]  # type: ignore[attr-defined]
    assert after_redelivery == []


def test_started_of_another_attempt_is_ignored() -> None:
    book = book_with("node-a")
    placed(book)

    book.apply(started(shard_index=0, attempt=2))
    book.apply(started(shard_index=1, attempt=2))

    assert book.on_shard_event(at(2)) == []


def test_all_shards_completed_emits_succeeded_once_and_frees_gpus() -> None:
    book = book_with("node-a")
    placed(book)
    book.apply(started(shard_index=0))
    book.apply(started(shard_index=1))
    book.on_shard_event(at(2))

    book.apply(completed(shard_index=1, final_loss=9.0))
    assert book.on_shard_event(at(3)) == []
    book.apply(completed(shard_index=0, final_loss=2.5))
    (succeeded,) = book.on_shard_event(at(4))

    assert isinstance(succeeded, JobSucceeded)
    assert (succeeded.job_id, succeeded.attempt, succeeded.final_loss) == ("job-1", 1, 2.5)
    assert succeeded.checkpoint_dir == "/data/checkpoints/job-1"
    assert book.on_shard_event(at(5)) == []
    assert free_gpus(book) == {"node-a": (0, 1)}
    assert book.cycle(at(6)) == []


def test_revocations_list_the_unfinished_shards_of_a_failed_gang() -> None:
    book = book_with("node-a", "node-b", gpu_count=1)
    scheduled, _ = placed(book)
    book.apply(completed(shard_index=0, node_id=scheduled.placements[0].node_id))
    failure = JobFailed(occurred_at=at(3), job_id="job-1", attempt=1, cause=FailureCause.KILLED, message="k")

    revocations = book.revocations(failure, at(3))

    assert len(revocations) == 1
    (revocation,) = revocations
    assert isinstance(revocation, ShardRevocation)
    assert (revocation.job_id, revocation.shard_index, revocation.attempt, revocation.term) == ("job-1", 1, 1, 3)
    assert revocation.node_id == scheduled.placements[1].node_id
    assert "KILLED" in revocation.message


def test_failed_job_frees_its_gpus_and_is_not_rescheduled() -> None:
    book = book_with("node-a")
    placed(book)

    book.apply(JobFailed(occurred_at=at(3), job_id="job-1", attempt=1, cause=FailureCause.KILLED, message="k"))
    book.apply(ready())  # a late (replayed) JobReady of the ended job

    assert free_gpus(book) == {"node-a": (0, 1)}
    assert book.cycle(at(4)) == []
    assert (
        book.revocations(
            JobFailed(occurred_at=at(5), job_id="job-1", attempt=1, cause=FailureCause.KILLED, message="k"), at(5)
        )
        == []
    )


def test_replayed_ready_then_scheduled_is_not_placed_again() -> None:
    live = book_with("node-a")
    scheduled, _ = placed(live)
    replayed = book_with("node-a", term=1)

    replayed.apply(ready())
    replayed.apply(scheduled)

    assert replayed.cycle(at(9)) == []
    assert free_gpus(replayed) == {"node-a": ()}
    # A book decides under its own replica's term (set when it takes over), never one it read: a deposed leader
    # that read its successor's placements must not publish under its successor's term. The read term fences.
    assert replayed.term == 1
    assert replayed.placed["job-1"] == (3, 1)


def test_replayed_gang_keeps_its_port() -> None:
    live = book_with("node-a", gpu_count=4)
    scheduled, _ = placed(live)
    replayed = book_with("node-a", gpu_count=4)
    replayed.apply(ready())
    replayed.apply(scheduled)

    second, _ = placed(replayed, "job-2")

    assert (second.coordinator_node, second.rendezvous_port) == ("node-a", 29501)
    assert {p.gpu_indices for p in second.placements} == {(2,), (3,)}


def test_the_tick_turns_the_last_cycles_blocked_jobs_into_a_capacity_request() -> None:
    book = SchedulerBook()
    book.apply(node_state("node-v", gpus=V100S))
    book.apply(ready())

    assert [type(e) for e in book.cycle(at(1))] == [JobUnschedulable]
    (request,) = book.elasticity_signals(at(31))

    assert isinstance(request, CapacityRequested)
    assert (request.gpu_model, request.gpus, request.jobs, request.waiting_s) == ("A100", 2, ("job-1",), 31.0)


def test_the_echo_of_a_placement_after_its_shards_started_keeps_them() -> None:
    book = book_with("node-a")
    book.apply(ready())
    scheduled, *_ = book.cycle(at(1))
    book.apply(started(shard_index=0))
    book.apply(started(shard_index=1))

    book.apply(scheduled)  # our own JobScheduled, read back from the lifecycle topic after the shard events
    (running,) = book.on_shard_event(at(2))

    assert isinstance(running, JobRunning)


class TestLearnedRunTimes:
    """Jobs that declare no run time get one learned from the jobs of their kind that succeeded (the 90th
    percentile of the last 200, from 5 on): their estimated starts and backfill use it."""

    RUNS = (100.0, 200.0, 300.0, 400.0, 1000.0)

    def run(self, book: SchedulerBook, job_id: str, started: float, run_s: float) -> None:
        book.apply(JobReady(occurred_at=at(started), job_id=job_id, spec=job_spec(job_id=job_id)))
        scheduled = next(e for e in book.cycle(at(started)) if isinstance(e, JobScheduled))
        book.apply(scheduled)
        ended = JobSucceeded(
            occurred_at=at(started + run_s), job_id=job_id, attempt=1, final_loss=1.0, checkpoint_dir=None
        )
        book.apply(ended)

    def test_a_job_that_declares_nothing_is_expected_to_run_as_long_as_most_of_its_kind(self) -> None:
        book = book_with("node-a")
        for number, run_s in enumerate(self.RUNS):
            self.run(book, f"done-{number}", 10_000.0 * number, run_s)

        book.apply(ready("new"))
        book.apply(ready("declared", expected_duration_s=50.0))

        assert book.pending["new"].expected_run_s == 1000.0  # p90 of 5 runs: the highest
        assert book.pending["declared"].expected_run_s == 50.0

    def test_too_few_runs_teach_nothing_and_failures_teach_nothing(self) -> None:
        book = book_with("node-a")
        for number, run_s in enumerate(self.RUNS[:4]):
            self.run(book, f"done-{number}", 10_000.0 * number, run_s)
        book.apply(ready("failing"))
        book.cycle(at(50_000))
        failed = JobFailed(
            occurred_at=at(50_100), job_id="failing", attempt=1, cause=FailureCause.PROCESS_EXIT, message="exit 1"
        )
        book.apply(failed)

        book.apply(ready("new"))

        assert book.pending["new"].expected_run_s is None

    def test_a_running_job_with_a_learned_run_time_has_an_expected_end(self) -> None:
        book = book_with("node-a")
        for number, run_s in enumerate(self.RUNS):
            self.run(book, f"done-{number}", 10_000.0 * number, run_s)
        book.apply(ready("new"))
        book.apply(next(e for e in book.cycle(at(60_000)) if isinstance(e, JobScheduled)))

        (gang,) = book.snapshot().running

        assert gang.expected_end == at(60_000 + 1000)


def test_a_job_that_never_fits_ends_unschedulable_at_the_bound_unless_a_node_that_could_hold_it_joins() -> None:
    book = SchedulerBook(unschedulable_after_s=600)
    book.apply(node_state("node-v", gpus=V100S))
    book.apply(ready())
    book.apply(ready(job_id="job-2"))

    (first, _second) = lifecycle(book.cycle(at(1)))
    assert isinstance(first, JobUnschedulable) and first.reason is PendingReason.NEVER_FITS
    assert lifecycle(book.cycle(at(300))) == []
    book.apply(node_state("node-a", gpus=gpus(count=1)))  # one A100: job-2 (2 shards) still never fits; job-1 neither
    book.apply(node_state("node-b", status=NodeStatus.LOST))  # a second A100, down: both could fit once it is back
    lifecycle(book.cycle(at(400)))
    assert book.reasons.never_fits_since == {}  # a wait again, no longer never
    book.apply(node_state("node-b", gpus=V100S))  # node-b turns out a V100 node: never again, counted afresh
    lifecycle(book.cycle(at(500)))
    assert lifecycle(book.cycle(at(1099))) == []
    ended = lifecycle(book.cycle(at(1100)))

    assert sorted((e.job_id, e.cause) for e in ended if isinstance(e, JobFailed)) == [
        ("job-1", FailureCause.UNSCHEDULABLE),
        ("job-2", FailureCause.UNSCHEDULABLE),
    ]
    assert all("never fitted this cluster in 600s" in e.message for e in ended if isinstance(e, JobFailed))
    assert lifecycle(book.cycle(at(1200))) == []  # ended once


def test_a_wait_for_artifacts_no_agent_has_reported_absent_goes_unsaid_for_a_while() -> None:
    """Every submission opened with a false WAITING_FOR_ARTIFACT: the first cycle ran before the agents had looked."""
    book = SchedulerBook()
    book.apply(node_state("node-a", artifacts={}))  # its agent has not looked for the job's paths yet
    book.apply(ready())

    assert lifecycle(book.cycle(at(1))) == []
    (late,) = lifecycle(book.cycle(at(11)))  # an agent that never reports: said, with why
    assert isinstance(late, JobUnschedulable) and late.reason is PendingReason.WAITING_FOR_ARTIFACT
    assert "have not reported" in late.message

    book.apply(node_state("node-a", artifacts={}, artifacts_absent=("/data/datasets/wikitext", "/data/models/gpt2")))
    (said,) = lifecycle(book.cycle(at(12)))
    assert isinstance(said, JobUnschedulable) and [m.path for m in said.missing_artifacts] == [
        "/data/models/gpt2",
        "/data/datasets/wikitext",
    ]
