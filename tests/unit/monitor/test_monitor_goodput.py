"""The monitor's goodput ledgers: per team queue, the counter of each part's seconds of the jobs that ended and their
ETTR, the cluster's ETTR, and each job's ledger, live, on its detail."""

from shardyard.events import (
    JobAccepted,
    JobReady,
    JobRejected,
    JobRunning,
    JobSucceeded,
    RejectReason,
    ShardProgress,
)
from shardyard.monitor.goodput import GoodputBook
from shardyard.monitor.metrics import MonitorMetrics
from shardyard.monitor.views import ClusterView
from tests.support.clock import FakeClock
from tests.unit.builders import at, job_spec, progress, scheduled
from tests.unit.monitor.test_monitor_metrics import value


def team_job(job_id: str, queue: str, *, ends_at: float | None) -> list[object]:
    """Accepted at 0, placed at 10, first step at 20; succeeds at ``ends_at`` (None: still running)."""
    spec = job_spec(job_id=job_id, queue=queue, submitted_at=at(0))
    events: list[object] = [
        JobAccepted(occurred_at=at(0), job_id=job_id, spec=spec, source_offset=f"s/0/{job_id}"),
        JobReady(occurred_at=at(0), job_id=job_id, spec=spec),
        scheduled(job_id, occurred_at=at(10)),
        JobRunning(occurred_at=at(12), job_id=job_id, attempt=1),
        progress(job_id, occurred_at=at(20), step=1),
    ]
    if ends_at is not None:
        events.append(
            JobSucceeded(occurred_at=at(ends_at), job_id=job_id, attempt=1, final_loss=1.0, checkpoint_dir=None)
        )
    return events


def view_of(*events: object) -> ClusterView:
    view = ClusterView()
    for event in events:
        view.apply(event)
    return view


def test_each_teams_ended_jobs_add_their_parts_and_make_its_ettr() -> None:
    view = view_of(
        *team_job("a1", "team-a", ends_at=60),  # queued 10, recovery 10, productive 40
        *team_job("a2", "team-a", ends_at=None),  # at 100: queued 10, recovery 10, productive 80
        *team_job("b1", "team-b", ends_at=30),  # queued 10, recovery 10, productive 10
    )
    text = MonitorMetrics(view, FakeClock(at(100))).exposition().decode()

    def seconds(queue: str, part: str) -> float | None:
        return value(text, "shardyard_goodput_seconds_total", queue=queue, part=part)

    assert (seconds("team-a", "queued"), seconds("team-a", "recovery"), seconds("team-a", "productive")) == (
        10.0,
        10.0,
        40.0,
    )
    assert (seconds("team-b", "productive"), seconds("team-b", "notice")) == (10.0, 0.0)
    assert value(text, "shardyard_goodput_ettr", queue="team-a") == 40 / 60  # a2 still runs: not counted yet
    assert value(text, "shardyard_goodput_ettr", queue="team-b") == 10 / 30
    assert value(text, "shardyard_goodput_cluster_ettr") == (40 + 10) / (60 + 30)
    assert MonitorMetrics(view, FakeClock(at(5000))).exposition().decode() == text  # not a function of the clock


def test_a_cluster_without_jobs_exports_the_families_without_samples() -> None:
    text = MonitorMetrics(ClusterView(), FakeClock(at(5))).exposition().decode()
    assert "# TYPE shardyard_goodput_seconds_total counter" in text and "# TYPE shardyard_goodput_ettr gauge" in text
    assert value(text, "shardyard_goodput_cluster_ettr") is None


def test_a_jobs_detail_carries_its_ledger_to_now_or_its_end() -> None:
    view = view_of(*team_job("a1", "team-a", ends_at=None))
    detail = view.job_detail(view.jobs["a1"], at(50))["goodput"]
    assert (detail["queued_s"], detail["recovery_s"], detail["productive_s"], detail["total_s"]) == (10, 10, 30, 50)
    assert detail["ettr"] == 0.6
    view.apply(JobSucceeded(occurred_at=at(60), job_id="a1", attempt=1, final_loss=1.0, checkpoint_dir=None))
    assert view.job_detail(view.jobs["a1"], at(500))["goodput"]["total_s"] == 60  # ended: no longer grows


def test_an_ended_jobs_ledger_is_made_again_only_when_a_late_report_changes_it() -> None:
    book = GoodputBook()
    events = team_job("a1", "team-a", ends_at=60)
    for event in events:
        if not isinstance(event, ShardProgress):
            book.lifecycle(event)  # type: ignore[arg-type]  # the lifecycle facts of the story
    made = book.ledger("a1", at(100))
    # no step read yet: productive from every shard started (12), as for a job whose shards report no steps
    assert made is not None and (made.recovery_s, made.productive_s) == (2, 48)
    assert book.ledger("a1", at(200)) is made  # kept made
    book.shard(progress("a1", occurred_at=at(20), step=1))  # read after the end: the other topic was behind
    again = book.ledger("a1", at(200))
    assert again is not None and (again.recovery_s, again.productive_s) == (10, 40)
    assert book.ledger("nobody", at(1)) is None


def test_a_jobs_steps_read_before_its_acceptance_count_and_a_rejection_is_no_job() -> None:
    events = team_job("a1", "team-a", ends_at=60)
    shard = [e for e in events if isinstance(e, ShardProgress)]
    view = view_of(*shard, *(e for e in events if e not in shard))
    assert view.job_detail(view.jobs["a1"], at(100))["goodput"]["productive_s"] == 40
    rejected = JobRejected(
        occurred_at=at(1), job_id="bad", reason=RejectReason.MISSING_FIELD, message="m", source_offset="s/0/9"
    )
    view.apply(rejected)
    assert "bad" not in view.goodput.folds and view.job_detail(view.jobs["bad"], at(2))["goodput"] is None
