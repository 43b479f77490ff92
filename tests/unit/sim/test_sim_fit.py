"""``shardyard simulate`` says when a trace does not fit the cluster it replays it on (``shardyard.sim.fit``)."""

from shardyard.sim.cluster import parse_cluster
from shardyard.sim.fit import fit_warnings
from shardyard.sim.generate import generate
from shardyard.sim.trace import TraceJob

SMALL = parse_cluster("A100:8x8,V100:8x8,H100:8x4")  # the default: 160 GPUs


def job(job_id: str, gpus: int, model: str | None = "A100", submit_s: float = 0.0) -> TraceJob:
    return TraceJob(job_id, submit_s, gpus, model, 600.0, 0, 0.0)


def test_a_trace_made_for_its_cluster_draws_no_warning() -> None:
    assert fit_warnings(generate(500, 1, SMALL), SMALL) == []


def test_a_trace_made_for_800_gpus_is_said_to_overload_160_and_sized() -> None:
    big = parse_cluster("A100:8x50,V100:8x50")
    warnings = fit_warnings(generate(1000, 1, big), SMALL)
    assert len(warnings) == 1, warnings
    assert "looks made for about 8" in warnings[0] and "--cluster" in warnings[0], warnings


def test_gangs_larger_than_the_clusters_gpus_of_their_kind_are_named() -> None:
    trace = [job("fits", 8, submit_s=0), job("huge", 128, submit_s=10_000), job("any", 200, None, 20_000)]
    (warning,) = fit_warnings(trace, SMALL)
    assert warning.startswith("2 jobs can never start"), warning
    assert "any, needs 200 GPUs, the cluster has 160" in warning and "huge" in warning, warning


def test_a_model_the_cluster_lacks_is_named() -> None:
    (warning,) = fit_warnings([job(f"t{i}", 1, "T4", i * 1000.0) for i in range(5)], SMALL)
    assert warning == "5 jobs ask for T4, which the cluster has none of (t0, t1, t2 and 2 more)"
