"""Lost work on hand-built traces: notices honoured or not, periodic checkpoints, restarts, recomputed work, and the
report's lost GPU-hours and ETTR. One node of 4 A100: ``low`` (priority 0, 100 s of work on 4 GPUs) starts at 0 and
higher-priority gangs preempt it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from shardyard.errors import ConfigError
from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.placement.model import RunningJob
from shardyard.sim import policies
from shardyard.sim.cluster import parse_cluster
from shardyard.sim.engine import US, SimResult, simulate
from shardyard.sim.lost_work import Attempt, Spent, WorkModel, preempted, stop
from shardyard.sim.policies import policy_named
from shardyard.sim.report import as_json, render_table, summarize
from shardyard.sim.trace import TraceJob
from tests.unit.sim.test_sim_report import simulate_cli

CLUSTER = "A100:4x1"
GPUS = 4


def job(job_id: str, submit: float, duration: float, priority: int = 0, **fields: Any) -> TraceJob:
    return TraceJob(job_id, submit, GPUS, "A100", duration, priority, DEFAULT_TFLOPS["A100"], **fields)


LOW = job("low", 0, 100)
HIGH = job("high", 10, 50, priority=500)


def run(trace: Sequence[TraceJob], work: WorkModel, name: str = "shardyard") -> SimResult:
    nodes = parse_cluster(CLUSTER)
    return simulate(trace, nodes, policy_named(name, nodes), name=name, work=work)


def times(result: SimResult) -> dict[str, tuple[float, float]]:
    """Job id -> (first start, finish) in seconds."""
    out = {}
    for o in result.outcomes:
        assert o.first_start_us is not None and o.finish_us is not None
        out[o.job.job_id] = (o.first_start_us / US, o.finish_us / US)
    return out


def per_gpu_s(spent: Spent) -> tuple[float, float, float, float]:
    """(productive, restart, recomputed, stopping) in seconds on each of the node's GPUs."""
    parts = (spent.productive, spent.restart, spent.recomputed, spent.stopping)
    return tuple(part / US / GPUS for part in parts)  # type: ignore[return-value]


class TestNoticeHonoured:
    """Notice at 10; ``low`` checkpoints on it in 10 s (all 100 s of work done so far kept), gives the node back at
    20; ``high`` runs 20-70; ``low`` restarts 70-130 and does its last 90 s by 220. Lost per GPU: 10 s stopping,
    60 s restart, nothing recomputed."""

    WORK = WorkModel(checkpoint_s=10, checkpoint_every_s=1800, notice_s=30, notice_share=1.0, restart_s=60)

    def test_the_timeline(self) -> None:
        result = run((LOW, HIGH), self.WORK)

        assert times(result) == {"low": (0, 220), "high": (20, 70)}
        assert result.preemptions == 1

    def test_the_lost_work(self) -> None:
        result = run((LOW, HIGH), self.WORK)

        # productive: low 10 + 90, high 50
        assert per_gpu_s(result.spent) == (150, 60, 0, 10)
        assert {o.job.job_id: o.productive_us / US for o in result.outcomes} == {"low": 100, "high": 50}

    def test_the_report(self) -> None:
        summary = summarize(run((LOW, HIGH), self.WORK))

        lost = (summary.lost_gpu_h_stopping, summary.lost_gpu_h_restart, summary.lost_gpu_h_recomputed)
        assert lost == pytest.approx((GPUS * 10 / 3600, GPUS * 60 / 3600, 0.0))
        assert summary.lost_gpu_h_preemption == pytest.approx(GPUS * 70 / 3600)
        # GPUs x productive / GPUs x JCT: (100 + 50) / (220 + 60), every job of 4 GPUs
        assert summary.ettr == pytest.approx(150 / 280)
        assert summary.gpu_utilisation == pytest.approx(1.0)  # stopping and restarting hold the GPUs

    def test_a_checkpoint_longer_than_the_notice_is_not_honoured(self) -> None:
        work = WorkModel(checkpoint_s=40, checkpoint_every_s=1800, notice_s=30, notice_share=1.0, restart_s=60)

        # stopped at the deadline 40 without a checkpoint: its 40 s of work are recomputed, 10 before the notice
        result = run((LOW, HIGH), work)

        assert times(result) == {"low": (0, 250), "high": (40, 90)}
        assert per_gpu_s(result.spent) == (150, 60, 10, 30)


class TestNoticeNotHonoured:
    """No job checkpoints on notice (``notice_share`` 0); the notice is 1 s. ``low`` checkpoints every 8 s of
    progress (its trace column; the run's default is an hour). Notice at 10, stopped at 11: it keeps the work of its
    checkpoint at 8; the 2 s before the notice are recomputed, the second of the notice is stopping. ``high`` runs
    11-61; ``low`` restarts 61-121 and does its last 92 s by 213."""

    WORK = WorkModel(checkpoint_s=10, checkpoint_every_s=3600, notice_s=1, notice_share=0.0, restart_s=60)
    LOW = job("low", 0, 100, checkpoint_every_s=8)

    def test_the_timeline_and_the_lost_work(self) -> None:
        result = run((self.LOW, HIGH), self.WORK)

        assert times(result) == {"low": (0, 213), "high": (11, 61)}
        # productive: low 8 + 92, high 50
        assert per_gpu_s(result.spent) == (150, 60, 2, 1)

    def test_a_periodic_checkpoint_within_the_notice_keeps_the_work_up_to_it(self) -> None:
        work = WorkModel(checkpoint_s=10, checkpoint_every_s=25, notice_s=30, notice_share=0.0, restart_s=60)

        # runs on to the deadline 40 past its checkpoint at 25: keeps 25 s, loses the 15 s after it
        result = run((LOW, HIGH), work)

        assert times(result) == {"low": (0, 225), "high": (40, 90)}
        assert per_gpu_s(result.spent) == (150, 60, 0, 15)

    def test_without_a_periodic_checkpoint_the_attempt_is_lost(self) -> None:
        result = run((LOW, HIGH), self.WORK)  # every hour: none by the deadline at 11

        assert times(result) == {"low": (0, 221), "high": (11, 61)}
        assert per_gpu_s(result.spent) == (150, 60, 10, 1)


def test_a_preemption_during_a_restart_loses_the_restart_so_far() -> None:
    """``top`` (priority 900) arrives at 100, while ``low`` restarts (70-130) after ``high``: ``low`` checkpoints on
    notice (nothing new to keep) 100-110, ``top`` runs 110-130, ``low`` restarts again 130-190 and finishes at 280.
    Per GPU: restarts 30 + 60, stopping 10 + 10."""
    top = job("top", 100, 20, priority=900)

    result = run((LOW, HIGH, top), TestNoticeHonoured.WORK)

    assert times(result) == {"low": (0, 280), "high": (20, 70), "top": (110, 130)}
    assert result.preemptions == 2
    assert per_gpu_s(result.spent) == (170, 90, 0, 20)


class TestTheModel:
    def test_the_parts_of_a_preempted_attempt_add_up_to_its_time_held(self) -> None:
        work = WorkModel(checkpoint_s=10, checkpoint_every_s=7, notice_s=5, notice_share=0.0, restart_s=3)
        attempt = Attempt(started_us=100 * US, restart_us=3 * US, every_us=7 * US)
        for notice_s in (100, 101, 103, 104, 109, 110, 125):
            stopping = stop(work, attempt, "j", notice_s * US)
            spent = preempted(attempt, stopping)

            parts = (spent.productive, spent.restart, spent.recomputed, spent.stopping)
            assert sum(parts) == stopping.release_us - attempt.started_us and min(parts) >= 0, notice_s

    def test_the_periodic_checkpoints_count_from_the_end_of_the_restart(self) -> None:
        attempt = Attempt(started_us=0, restart_us=60 * US, every_us=30 * US)

        got = [attempt.checkpointed_us(at * US) for at in (0, 89, 90, 119, 120)]

        assert got == [None, None, 90 * US, 90 * US, 120 * US]
        assert attempt.next_checkpoint_us(0) == 90 * US and attempt.next_checkpoint_us(90 * US) == 120 * US

    def test_the_jobs_that_honour_notices_are_a_stable_share(self) -> None:
        ids = [f"job-{n}" for n in range(2000)]

        def honouring(share: float) -> set[str]:
            work = WorkModel(notice_share=share)
            return {job_id for job_id in ids if work.honours_notice(job_id)}

        assert honouring(0.0) == set() and honouring(1.0) == set(ids)
        assert 0.27 * len(ids) < len(honouring(0.3)) < 0.33 * len(ids)
        assert honouring(0.3) == honouring(0.3) and honouring(0.3) < honouring(0.6)

    @pytest.mark.parametrize(
        ("fields", "problem"),
        [
            pytest.param({"restart_s": -1.0}, "restart_s: must be", id="negative-restart"),
            pytest.param({"checkpoint_every_s": 0.0}, "checkpoint_every_s: must be", id="zero-interval"),
            pytest.param({"notice_share": 1.5}, "notice_share: must be", id="share-above-one"),
            pytest.param({"notice_s": float("inf")}, "notice_s: must be", id="endless-notice"),
        ],
    )
    def test_settings_out_of_range_are_refused(self, fields: dict[str, float], problem: str) -> None:
        with pytest.raises(ValueError, match=problem):
            WorkModel(**fields)


def test_the_core_is_told_each_gangs_last_checkpoint_and_restart_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """``low`` checkpoints every 30 s; jobs that wait behind it arrive at 20, 45 and 70, each a cycle."""
    seen: list[tuple[float, float | None, float | None]] = []
    real = policies.schedule

    def spy(snapshot: policies.Snapshot, *args: Any, **kwargs: Any) -> Any:
        for gang in snapshot.running:
            if gang.job_id == "low":
                seen.append((_s(kwargs["now"]), _checkpointed_s(gang), gang.restart_s))
        return real(snapshot, *args, **kwargs)

    monkeypatch.setattr(policies, "schedule", spy)
    waiting = [job(f"w{at}", at, 10) for at in (20, 45, 70)]
    work = WorkModel(checkpoint_every_s=30, restart_s=45)

    run((LOW, *waiting), work)

    assert seen == [(20, None, 45), (45, 30, 45), (70, 60, 45)]


def _s(when: Any) -> float:
    return (when - policies.EPOCH).total_seconds()


def _checkpointed_s(gang: RunningJob) -> float | None:
    return None if gang.checkpointed_at is None else _s(gang.checkpointed_at)


def test_the_report_shows_lost_work_and_ettr() -> None:
    summary = summarize(run((LOW, HIGH), TestNoticeHonoured.WORK))

    shown = as_json([summary])["policies"]["shardyard"]
    table = render_table([summary]).splitlines()

    assert shown["lost_gpu_h_preemption"] == round(GPUS * 70 / 3600, 3) and shown["ettr"] == round(150 / 280, 6)
    assert {"lost_gpu_h_stopping", "lost_gpu_h_restart", "lost_gpu_h_recomputed"} <= set(shown)
    assert "LOST GPU-h" in table[0] and "ETTR" in table[0]
    assert table[-1].split()[-3:-1] == ["0.1", "0.536"]  # GPU-hours lost (0.078), ETTR; degraded last


def test_simulate_takes_the_lost_work_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("submit_s,gpus,gpu_model,duration_s,priority\n0,4,A100,100,0\n10,4,A100,50,500\n")
    flags = ("--notice-s", "1", "--notice-share", "0", "--checkpoint-every-s", "8", "--restart-s", "60")

    assert simulate_cli(str(trace), "--cluster", CLUSTER, "--policy", "shardyard", "--json", *flags) == 0

    report = json.loads(capsys.readouterr().out)
    assert (report["notice_s"], report["notice_share"], report["checkpoint_every_s"]) == (1, 0, 8)
    # TestNoticeNotHonoured's timeline: per GPU 2 s recomputed, 1 s stopping, 60 s restart
    assert report["policies"]["shardyard"]["lost_gpu_h_preemption"] == round(GPUS * 63 / 3600, 3)


def test_simulate_refuses_a_share_out_of_range(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("submit_s,gpus,gpu_model,duration_s,priority\n0,4,A100,100,0\n")

    with pytest.raises(ConfigError, match=r"--notice-share must be a share within 0\.\.1"):
        simulate_cli(str(trace), "--cluster", CLUSTER, "--notice-share", "2")


def test_the_order_policy_is_the_core_with_todays_victim_rule() -> None:
    nodes = parse_cluster(CLUSTER)

    ordered = policy_named("shardyard-order", nodes)
    default = policy_named("shardyard", nodes)

    assert isinstance(ordered, policies.CorePolicy) and isinstance(default, policies.CorePolicy)
    assert (ordered.policy.victims, default.policy.victims) == ("order", "lost-work")


def test_the_victim_rule_is_a_policy_option() -> None:
    assert policies.policy_with(["victims=order"]).victims == "order"
    with pytest.raises(ConfigError, match="expected one of lost-work, order"):
        policies.policy_with(["victims=random"])
