"""The simulator audits the start estimates it issues: each held against the job's actual start."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from shardyard.events import PendingReason
from shardyard.placement.model import Unschedulable
from shardyard.sim.lost_work import US
from shardyard.sim.policies import EPOCH
from shardyard.sim.start_audit import StartAudit
from tests.unit.sim.test_sim_report import simulate_cli


def estimate(job_id: str, p50_s: float, p90_s: float | None) -> Unschedulable:
    return Unschedulable(
        job_id,
        PendingReason.INSUFFICIENT_GPUS,
        "busy",
        estimated_start=EPOCH + timedelta(seconds=p50_s),
        estimated_start_p90=None if p90_s is None else EPOCH + timedelta(seconds=p90_s),
    )


def us(seconds: float) -> int:
    return int(seconds * US)


def test_the_estimate_in_force_at_submission_and_halfway_is_judged_against_the_actual_start() -> None:
    audit = StartAudit()
    audit.record([estimate("a", 150, 300), estimate("b", 400, 450)], us(0), EPOCH)  # both submitted at 0
    audit.record([estimate("a", 210, 260)], us(100), EPOCH)  # a, re-estimated before its halfway (at 100)
    audit.record([estimate("b", 999, 999)], us(300), EPOCH)  # b's, after its halfway (at 100): not in force

    report = audit.report({"a": 0, "b": 0, "quick": 0}, {"a": us(200), "b": us(200), "quick": us(30)})

    assert report["jobs"] == 2  # quick waited under 60 s
    # a: |150 - 200| / 200 = 0.25, covered (300 >= 200); b: |400 - 200| / 200 = 1.0, covered.
    assert report["at_submission"] == {
        "estimated": 2,
        "median_abs_error_ratio": 0.625,
        "p90_coverage": 1.0,
        "p90_too_wide_ratio": 0.875,  # the median of a: 100 / 200, b: 250 / 200
    }
    # Halfway: a's second estimate (|210 - 200| / 200 = 0.05, covered); b's first again.
    assert report["halfway"]["median_abs_error_ratio"] == pytest.approx(0.525)
    assert report["meets_target"] is False


def test_a_job_started_after_its_p90_is_not_covered_and_one_never_estimated_is_counted_apart() -> None:
    audit = StartAudit()
    audit.record([estimate("late", 100, 110)], us(0), EPOCH)

    report = audit.report({"late": 0, "unknown": 0}, {"late": us(200), "unknown": us(500)})

    assert report["jobs"] == 2
    assert report["at_submission"]["estimated"] == 1
    assert report["at_submission"]["p90_coverage"] == 0.0


def test_estimates_are_made_when_a_job_arrives_and_every_reissue_period() -> None:
    audit = StartAudit(reissue_us=us(300))
    assert audit.due(["a"], us(0))
    assert not audit.due(["a"], us(10))
    assert audit.due(["a", "b"], us(20))  # b arrived
    assert audit.due(["a", "b"], us(320))


def test_simulate_json_carries_the_audit_unless_told_not_to(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    # One node of 4 GPUs; a job holds it 600 s; five more of known kind wait behind it in turn.
    rows = ["submit_s,gpus,gpu_model,duration_s,priority,expected_duration_s"]
    rows += [f"{i},4,A100,600,0,600" for i in range(6)]
    trace.write_text("\n".join(rows) + "\n")

    assert simulate_cli(str(trace), "--cluster", "A100:4x1", "--policy", "shardyard", "--json") == 0
    audited = json.loads(capsys.readouterr().out)["start_estimates"]
    assert (
        simulate_cli(str(trace), "--cluster", "A100:4x1", "--policy", "shardyard", "--json", "--no-start-estimates")
        == 0
    )
    skipped = json.loads(capsys.readouterr().out)

    assert audited["jobs"] == 5 and audited["at_submission"]["estimated"] == 5
    assert "start_estimates" not in skipped

    assert simulate_cli(str(trace), "--cluster", "A100:4x1", "--json", "--start-estimates-oracle") == 0
    told = json.loads(capsys.readouterr().out)["start_estimates"]
    assert told["oracle"] is True and not audited["oracle"]
    # Told the true run times, one job after another on one node: every estimate is the start to the microsecond.
    assert told["at_submission"]["median_abs_error_ratio"] == 0.0 and told["at_submission"]["p90_coverage"] == 1.0
