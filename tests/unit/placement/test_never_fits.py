"""NEVER_FITS (``placement.inventory``): a job that no set of the cluster's nodes could hold, even all idle, is told so
at once, with what it asked and what the cluster has; a job the cluster could hold once nodes come back or gangs end
hears the wait's own reason. Such a job preempts and reserves nothing."""

import pytest

from shardyard.events import NodeStatus, PendingReason
from shardyard.placement.model import Preempt
from tests.unit.builders import GIB
from tests.unit.placement_support import blocked, decide, node, only, pending, running

V100S = [node("v1", "V100", 4), node("v2", "V100", 4)]


@pytest.mark.parametrize(
    ("nodes", "job", "named"),
    [
        pytest.param(V100S, pending(gpu_count=2), "8 x V100", id="no-gpu-of-its-model"),
        pytest.param([node("a1", gpus=2), node("a2", gpus=2)], pending(gpu_count=5), "4 x A100", id="too-few-gpus"),
        pytest.param(
            [node("a1", "A100", 2, tflops=20.0)], pending(gpu_count=1), "2 x A100", id="tflops-below-its-minimum"
        ),
        pytest.param(
            [node("a1", gpus=8, free_memory_bytes=64 * GIB, total_memory_bytes=64 * GIB)],
            pending(gpu_count=2, memory_bytes=256 * GIB),  # 128 GiB a shard
            "8 x A100",
            id="memory-of-no-node-enough",
        ),
        pytest.param(
            [node(n, gpus=8, free_cpu_cores=8.0, total_cpu_cores=8.0) for n in ("a1", "a2")],
            pending(gpu_count=4, cpu_cores=64.0),  # 16 cores a shard
            "16 x A100",
            id="cpu-of-no-node-enough",
        ),
    ],
)
def test_a_job_no_set_of_nodes_could_ever_hold_never_fits(nodes: list, job: object, named: str) -> None:
    decision = blocked(only(nodes, job))  # type: ignore[arg-type]

    assert decision.reason is PendingReason.NEVER_FITS
    assert "could ever hold the gang of" in decision.message and f"the cluster's GPUs: {named}" in decision.message


@pytest.mark.parametrize(
    ("nodes", "job", "reason"),
    [
        pytest.param(
            [*V100S, node("a9", status=NodeStatus.LOST)],
            pending(),
            PendingReason.GPU_MODEL_MISMATCH,
            id="its-kind-down-for-now",
        ),
        pytest.param(
            [node("a1", gpus=4, free_gpus=())], pending(gpu_count=4), PendingReason.INSUFFICIENT_GPUS, id="all-busy"
        ),
        pytest.param(
            V100S, pending(min_match=0.4, max_wait_s=30), PendingReason.GPU_MODEL_MISMATCH, id="degraded-opt-in"
        ),
        pytest.param([node("a1", draining=True)], pending(), PendingReason.NO_FIT, id="draining"),
        pytest.param([], pending(), PendingReason.NO_NODES, id="no-nodes-yet"),
    ],
)
def test_a_job_the_cluster_could_hold_waits_with_its_waits_reason(
    nodes: list, job: object, reason: PendingReason
) -> None:
    assert blocked(only(nodes, job)).reason is reason  # type: ignore[arg-type]


def test_a_job_that_never_fits_preempts_nothing() -> None:
    full = node("a1", gpus=2, free_gpus=())
    gangs = (running("low", ("a1", (0, 1)), priority=1),)

    decisions = decide([full], [pending("vip", priority=9, gpu_count=3)], gangs=gangs)

    assert not any(isinstance(d, Preempt) for d in decisions)
    assert blocked(decisions[-1]).reason is PendingReason.NEVER_FITS
