"""The simulator knows queues: the core under a queues file reclaims a borrowed quota for its team, each queue's
share of its entitlement and Jain's index say how fairly the cluster was shared, and the report gives per-queue
JCT and wait."""

import json
from pathlib import Path

import pytest

from shardyard.errors import ConfigError
from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.quotas import parse_queues
from shardyard.sim.cluster import parse_cluster
from shardyard.sim.engine import simulate
from shardyard.sim.fairness import Entitlements, ShareLog, jain
from shardyard.sim.generate import generate, parse_queue_mix
from shardyard.sim.policies import policy_named
from shardyard.sim.report import summarize
from shardyard.sim.trace import TraceJob, trace_text
from tests.unit.sim.test_sim_report import simulate_cli

QUEUES = "min_runtime_s: 0\nqueues:\n  a: {cohort: lab, gpus: {A100: 2}}\n  b: {cohort: lab, gpus: {A100: 2}}\n"
NODES = parse_cluster("A100:4x1", DEFAULT_TFLOPS)


def job(job_id: str, queue: str, submit_s: float, duration_s: float = 1000.0) -> TraceJob:
    return TraceJob(job_id, submit_s, 1, "A100", duration_s, 0, 35.0, queue=queue)


# Team a fills the cluster (4 GPUs, its nominal 2) by borrowing; team b then wants 3 (its nominal 2, and one more).
TRACE = [*(job(f"a{i}", "a", 0) for i in range(4)), *(job(f"b{i}", "b", 10) for i in range(3))]


def run(policy: str, *, quotas: bool) -> dict[str, float]:
    config = parse_queues(QUEUES)
    owed = Entitlements.of(config, NODES)
    chosen = policy_named(policy, NODES, None, config if quotas else None)
    return simulate(TRACE, NODES, chosen, name=policy, owed=owed).shares


def test_the_lenders_team_gets_its_quota_back_under_quotas_and_not_without() -> None:
    fair = run("shardyard", quotas=True)
    unfair = run("priority", quotas=True)

    assert fair["b"] > 0.95, fair  # b waited ~10 s of its ~1000 s with nothing, then held its nominal
    assert unfair["b"] < 0.05, unfair  # priority-only: b waits with nothing until a's gangs end
    assert jain(fair.values()) > 0.99 and jain(unfair.values()) < 0.6


@pytest.mark.parametrize(
    ("values", "expected"),
    [([1.0, 1.0, 1.0], 1.0), ([1.0, 0.0, 0.0], 1 / 3), ([0.5, 0.5], 1.0), ([], 1.0), ([1.0, 0.5], 0.9)],
)
def test_jains_index(values: list[float], expected: float) -> None:
    assert jain(values) == pytest.approx(expected)


def test_a_queue_is_owed_its_nominal_as_far_as_it_wants_it() -> None:
    owed = Entitlements.of(
        parse_queues("queues:\n  a: {gpus: {A100: 4, V100: 4}}\n"), parse_cluster("A100:8x1,V100:8x1", DEFAULT_TFLOPS)
    )
    log = ShareLog(owed)
    log.hold("a", "A100", 4)
    log.ask("a", "V100", 2)
    assert log.satisfaction("a") == pytest.approx(4 * 35 / (4 * 35 + 2 * 15))  # owed 2 V100 it does not hold

    log.ask("a", "V100", 8)  # a gang larger than its V100 nominal is owed nothing
    assert log.satisfaction("a") == pytest.approx(4 * 35 / (4 * 35 + 2 * 15))
    log.hold("a", "V100", 2)
    log.ask("a", "V100", -2)
    assert log.satisfaction("a") == 1.0


def test_the_cli_reports_per_queue_figures_and_refuses_a_queue_the_file_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, queues = tmp_path / "t.csv", tmp_path / "q.yaml"
    trace.write_text(trace_text(TRACE))
    queues.write_text(QUEUES)

    assert simulate_cli(str(trace), "--cluster", "A100:4x1", "--queues-file", str(queues), "--json") == 0
    shown = json.loads(capsys.readouterr().out)["policies"]
    assert set(shown) >= {"shardyard", "shardyard-one-queue", "priority"}
    assert set(shown["shardyard"]["queues"]) == {"a", "b"} and shown["shardyard"]["jain_index"] > 0.99
    assert shown["shardyard"]["queues"]["b"]["completed"] == 3

    queues.write_text("queues:\n  a: {gpus: {A100: 2}}\n")
    with pytest.raises(ConfigError, match=r"UNKNOWN_QUEUE.*b"):
        simulate_cli(str(trace), "--cluster", "A100:4x1", "--queues-file", str(queues))
    queues.write_text("queues:\n  a: {gpus: {A100: lots}}\n")
    with pytest.raises(ConfigError, match="line 2"):
        simulate_cli(str(trace), "--cluster", "A100:4x1", "--queues-file", str(queues))


def test_generated_jobs_spread_over_the_queues_and_keep_their_shape() -> None:
    mix = parse_queue_mix("a:3,b:1")
    plain = generate(400, 7, NODES)
    spread = generate(400, 7, NODES, queues=mix)

    assert [j.duration_s for j in spread] == [j.duration_s for j in plain]
    counts = {q: sum(1 for j in spread if j.queue == q) for q in mix}
    assert 250 < counts["a"] < 350 and counts["a"] + counts["b"] == 400
    with pytest.raises(ValueError, match="weight"):
        parse_queue_mix("a:0")


def test_a_trace_with_queues_reports_each_queue_without_a_file() -> None:
    summary = summarize(simulate(TRACE, NODES, policy_named("shardyard", NODES), name="shardyard"))

    assert set(summary.queues) == {"a", "b"} and summary.jain_index is None
    assert "share_of_entitlement" not in summary.queues["a"]
