"""The simulator's settings, baselines, trace columns and trace shapes; the duration estimates the core is told."""

import io
import math
import statistics

import pytest

from shardyard.errors import ConfigError
from shardyard.placement.estimates import DurationEstimates, EstimateKey
from shardyard.placement.model import Policy
from shardyard.sim.cluster import parse_cluster
from shardyard.sim.engine import Outcome, simulate
from shardyard.sim.generate import generate
from shardyard.sim.policies import policy_named, policy_with
from shardyard.sim.report import summarize
from shardyard.sim.trace import TraceError, TraceJob, parse_trace


class TestEstimates:
    KEY = EstimateKey("alice", "A100", 2)

    def test_nothing_is_estimated_from_too_few_runs(self) -> None:
        estimates = DurationEstimates(min_samples=3)
        estimates.observe(self.KEY, 100.0)
        estimates.observe(self.KEY, 100.0)

        assert estimates.estimate(self.KEY) is None

    def test_a_high_quantile_of_the_same_owner_model_and_count(self) -> None:
        estimates = DurationEstimates(quantile=0.9, min_samples=5)
        for run_s in range(1, 11):  # 1..10
            estimates.observe(self.KEY, float(run_s * 100))

        assert estimates.estimate(self.KEY) == 900.0

    def test_a_new_owner_gets_the_estimate_of_the_same_model_and_count_then_of_the_count(self) -> None:
        estimates = DurationEstimates(quantile=1.0, min_samples=2)
        for run_s in (10.0, 20.0):
            estimates.observe(self.KEY, run_s)
        estimates.observe(EstimateKey("bob", "V100", 2), 500.0)

        assert estimates.estimate(EstimateKey("carol", "A100", 2)) == 20.0
        assert estimates.estimate(EstimateKey("carol", "H100", 2)) == 500.0  # any model, 2 GPUs: 10, 20, 500
        assert estimates.estimate(EstimateKey("carol", "H100", 4)) is None

    def test_only_the_window_counts(self) -> None:
        estimates = DurationEstimates(quantile=1.0, window=3, min_samples=1)
        for run_s in (1000.0, 1.0, 2.0, 3.0):
            estimates.observe(self.KEY, run_s)

        assert estimates.estimate(self.KEY) == 3.0

    def test_a_nonsensical_run_time_teaches_nothing(self) -> None:
        estimates = DurationEstimates(min_samples=1)
        estimates.observe(self.KEY, math.nan)
        estimates.observe(self.KEY, -5.0)

        assert estimates.estimate(self.KEY) is None


class TestPolicyOptions:
    def test_options_set_the_cores_knobs(self) -> None:
        policy = policy_with(["order=aging", "backfill=false", "min-runtime-s=300", "las_thresholds_gpu_s=36000,3600"])

        assert (policy.order, policy.backfill, policy.min_runtime_s) == ("aging", False, 300.0)
        assert policy.las_thresholds_gpu_s == (3600.0, 36000.0)
        assert policy_with([]) == Policy()

    @pytest.mark.parametrize(
        ("option", "problem"),
        [
            ("order=random", "expected one of las, aging"),
            ("backfill=maybe", "expected true or false"),
            ("min_runtime_s=-1", "expected a finite number >= 0"),
            ("reservations=two", "--policy-option reservations='two'"),
            ("warp=9", "KEY one of"),
            ("order", "write KEY=VALUE"),
        ],
    )
    def test_a_bad_option_is_refused_naming_it(self, option: str, problem: str) -> None:
        with pytest.raises(ConfigError, match=problem):
            policy_with([option])


class TestTraceColumns:
    HEADER = "submit_s,gpus,gpu_model,duration_s,priority,user,queue,expected_duration_s\n"

    def test_user_queue_and_declared_duration(self) -> None:
        (job,) = parse_trace(io.StringIO(self.HEADER + "0,2,A100,60,0,alice,research,90\n"))

        assert (job.user, job.queue, job.expected_duration_s) == ("alice", "research", 90.0)

    def test_a_fractional_gpu_is_refused_unless_rounded_up(self) -> None:
        text = "submit_s,gpus,gpu_model,duration_s,priority\n0,0.5,A100,60,0\n"
        with pytest.raises(TraceError, match="fractional GPU"):
            parse_trace(io.StringIO(text))

        (job,) = parse_trace(io.StringIO(text), round_gpus=True)
        assert job.gpus == 1


class TestBaselines:
    CLUSTER = "A100:4x1,T4:4x1"

    def test_first_fit_is_type_blind_and_a_slower_gpu_runs_slower(self) -> None:
        nodes = parse_cluster(self.CLUSTER)
        trace = [
            TraceJob("hold", 0.0, 4, "A100", 100.0, 0, 35.0),
            TraceJob("next", 1.0, 4, "A100", 100.0, 0, 35.0),
        ]

        def run(name: str) -> dict[str, Outcome]:
            return {o.job.job_id: o for o in simulate(trace, nodes, policy_named(name, nodes), name=name).outcomes}

        outcomes, priority = run("first-fit"), run("priority")

        assert outcomes["next"].first_start_us == 1_000_000  # on the idle T4s at once...
        assert (outcomes["next"].finish_us or 0) > 101_000_000 * 4  # ...at 8.1/35 of the speed
        assert priority["next"].first_start_us == 100_000_000  # the priority baseline waits for an A100

    def test_the_oracle_runs_the_shortest_first(self) -> None:
        nodes = parse_cluster("A100:1x1")
        trace = [
            TraceJob("first", 0.0, 1, "A100", 10.0, 0, 35.0),
            TraceJob("long", 1.0, 1, "A100", 500.0, 0, 35.0),
            TraceJob("short", 2.0, 1, "A100", 5.0, 0, 35.0),
        ]

        result = simulate(trace, nodes, policy_named("sjf-oracle", nodes), name="sjf")

        starts = {o.job.job_id: o.first_start_us for o in result.outcomes}
        assert starts["short"] == 10_000_000 and starts["long"] == 15_000_000


class TestShapes:
    NODES = parse_cluster("V100:8x16")

    def test_helios_has_its_published_median_and_a_far_larger_mean(self) -> None:
        jobs = generate(4000, 3, self.NODES, shape="helios")
        durations = [job.duration_s for job in jobs]

        assert 150 <= statistics.median(durations) <= 280  # published: 206 s
        assert statistics.mean(durations) > 10 * statistics.median(durations)  # published: 6,652 s vs 206 s
        assert 3.0 <= statistics.mean(job.gpus for job in jobs) <= 4.5  # published: 3.7

    def test_philly_is_mostly_one_gpu_with_a_few_wide_gangs(self) -> None:
        jobs = generate(4000, 3, self.NODES, shape="philly")
        sizes = [job.gpus for job in jobs]

        assert sizes.count(1) / len(sizes) > 0.6
        assert 0 < sum(1 for s in sizes if s >= 32) < 0.05 * len(sizes)
        assert max(job.duration_s for job in jobs) > 7 * 86_400  # weeks at the tail

    @pytest.mark.parametrize("load", [0.7, 0.9, 1.1])
    def test_the_offered_load_within_the_arrivals_is_the_one_asked_for(self, load: float) -> None:
        jobs = generate(3000, 5, self.NODES, shape="helios", load=load)
        span = jobs[-1].submit_s - jobs[0].submit_s
        used = sum(job.gpus * min(job.duration_s, span - job.submit_s) for job in jobs)

        assert used / (128 * span) == pytest.approx(load, rel=0.01)
        # the multi-week jobs run on past the last arrival: counting their whole runs would overstate the load
        assert sum(job.gpus * job.duration_s for job in jobs) / (128 * span) > 1.1 * load

    def test_an_unknown_shape_is_refused(self) -> None:
        with pytest.raises(ValueError, match="unknown shape"):
            generate(10, 1, self.NODES, shape="borg")


def test_the_core_is_told_declared_durations_and_backfills_on_them() -> None:
    """One node of 4 GPUs: a gang holds 2 until 100; a 4-GPU job reserves the node; a 2-GPU job declared to end
    before the reservation starts backfills; one that declares nothing waits for the wide job."""
    nodes = parse_cluster("A100:4x1")
    trace = [
        TraceJob("hold", 0.0, 2, "A100", 100.0, 5, 35.0, expected_duration_s=100.0),
        TraceJob("wide", 1.0, 4, "A100", 50.0, 5, 35.0, expected_duration_s=50.0),
        TraceJob("short", 2.0, 2, "A100", 40.0, 5, 35.0, expected_duration_s=60.0),
        TraceJob("unsaid", 3.0, 2, "A100", 40.0, 5, 35.0),
    ]

    result = simulate(trace, nodes, policy_named("shardyard", nodes), name="shardyard")

    starts = {o.job.job_id: (o.first_start_us or 0) / 1e6 for o in result.outcomes}
    assert starts == {"hold": 0.0, "wide": 100.0, "short": 2.0, "unsaid": 150.0}
    assert summarize(result).completed == 4
