from __future__ import annotations

from dataclasses import replace

import pytest

from shardyard.events import JobSpec, NodeStatus, PendingReason
from shardyard.scheduler.placement import NodeView, Place, Snapshot, Unschedulable, place_job, schedule
from tests.unit.builders import GIB, at, job_spec


def node(node_id: str, model: str = "A100", gpus: int = 2, **overrides: object) -> NodeView:
    view = NodeView(
        node_id=node_id,
        status=NodeStatus.ALIVE,
        address=f"{node_id}.cluster",
        gpu_model=model,
        tflops={"A100": 35.0, "V100": 15.0, "H100": 67.0}.get(model, 35.0),
        free_gpus=tuple(range(gpus)),
        free_memory_bytes=256 * GIB,
        free_cpu_cores=32.0,
        cpu_load=0.1,
        rendezvous_ports=(29500, 29501),
    )
    return replace(view, **overrides)  # type: ignore[arg-type]


def nodes_of(decision: Place) -> list[str]:
    return [p.node_id for p in decision.placements]


SPEC = job_spec()  # 2 x A100 >= 35 TFLOPS, 64 GiB, 8 cores
V100S = [node("v1", "V100", 4), node("v2", "V100", 4)]


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        pytest.param([*V100S, node("a1", gpus=2)], ["a1", "a1"], id="a100-among-v100s"),
        pytest.param([*V100S, node("a1", gpus=1), node("a2", gpus=1)], ["a1", "a2"], id="split-over-a100s"),
        pytest.param([node("a1", "NVIDIA A100-SXM4-80GB")], ["a1", "a1"], id="nvml-model-name"),
        pytest.param([node("a1", gpus=4)], ["a1", "a1"], id="multi-gpu-node-takes-both"),
        pytest.param(
            [node("a1", status=NodeStatus.SUSPECT), node("a2", status=NodeStatus.LOST), node("a3")],
            ["a3", "a3"],
            id="only-alive-nodes",
        ),
        pytest.param([node("a1", cpu_load=0.9), node("a2", cpu_load=0.2)], ["a2", "a2"], id="lower-load-first"),
        pytest.param(
            [node("a1", free_memory_bytes=32 * GIB), node("a2", gpus=1)], ["a1", "a2"], id="memory-caps-shards"
        ),
        pytest.param([node("a1", free_cpu_cores=4.0), node("a2", gpus=1)], ["a1", "a2"], id="cpu-caps-shards"),
        pytest.param([node("a1", free_memory_bytes=16 * GIB), node("a2")], ["a2", "a2"], id="memory-filter"),
        pytest.param([node("a1", free_cpu_cores=2.0), node("a2")], ["a2", "a2"], id="cpu-filter"),
        pytest.param([node("a1", free_gpus=()), node("a2")], ["a2", "a2"], id="busy-node-skipped"),
    ],
)
def test_place(nodes: list[NodeView], expected: list[str]) -> None:
    decision = place_job(nodes, SPEC)

    assert isinstance(decision, Place), decision
    assert nodes_of(decision) == expected
    assert [p.shard_index for p in decision.placements] == list(range(SPEC.shard_count))
    assert decision.coordinator_node == expected[0]


def test_shards_on_one_node_get_distinct_gpus() -> None:
    decision = place_job([node("a1", gpus=4, free_gpus=(1, 3, 4))], job_spec(gpu_count=3))

    assert isinstance(decision, Place)
    assert [p.gpu_indices for p in decision.placements] == [(1,), (3,), (4,)]
    assert {p.match_score for p in decision.placements} == {1.0}


def test_any_model_job_ranks_by_load() -> None:
    spec = job_spec(gpu_model=None, min_tflops=0.0, gpu_count=1)

    decision = place_job([node("a1", cpu_load=0.5), node("v1", "V100", cpu_load=0.1)], spec)

    assert isinstance(decision, Place) and nodes_of(decision) == ["v1"]


@pytest.mark.parametrize(
    ("nodes", "spec", "reason", "counts"),
    [
        pytest.param([], SPEC, PendingReason.NO_NODES, {}, id="no-nodes"),
        pytest.param(V100S, SPEC, PendingReason.GPU_MODEL_MISMATCH, {"GPU model mismatch": 2}, id="only-v100s"),
        pytest.param(
            V100S,
            job_spec(gpu_model=None),
            PendingReason.INSUFFICIENT_TFLOPS,
            {"TFLOPS below minimum": 2},
            id="any-model-too-slow",
        ),
        pytest.param(
            [node("a1")],
            job_spec(min_tflops=50.0),
            PendingReason.INSUFFICIENT_TFLOPS,
            {"TFLOPS below minimum": 1},
            id="a100-below-min-flops",
        ),
        pytest.param(
            [node("a1", gpus=1), node("a2", gpus=1)],
            job_spec(gpu_count=3),
            PendingReason.INSUFFICIENT_GPUS,
            {"fewer free GPUs than shards": 2},
            id="gang-3-on-2-gpus",
        ),
        pytest.param(
            [node("a1", status=NodeStatus.LOST), node("a2", status=NodeStatus.SUSPECT)],
            SPEC,
            PendingReason.NO_FIT,
            {"node not alive": 2},
            id="none-alive",
        ),
        pytest.param(
            [node("a1", free_memory_bytes=GIB), node("a2", free_cpu_cores=1.0), node("v1", "V100")],
            SPEC,
            PendingReason.NO_FIT,
            {"insufficient memory": 1, "insufficient CPU": 1, "GPU model mismatch": 1},
            id="mixed-exclusions",
        ),
    ],
)
def test_unschedulable(nodes: list[NodeView], spec: JobSpec, reason: PendingReason, counts: dict[str, int]) -> None:
    decision = place_job(nodes, spec)

    assert isinstance(decision, Unschedulable), decision
    assert (decision.job_id, decision.reason, decision.node_counts) == (spec.job_id, reason, counts)
    assert decision.message


def test_coordinator_without_ports_is_unschedulable() -> None:
    decision = place_job([node("a1", rendezvous_ports=())], SPEC)

    assert isinstance(decision, Unschedulable)
    assert decision.node_counts.get("no free rendezvous port") == 1


def test_coordinator_moves_to_a_node_with_a_free_port() -> None:
    decision = place_job([node("a1", cpu_load=0.0, rendezvous_ports=()), node("a2", cpu_load=0.5)], SPEC)

    assert isinstance(decision, Place)


def _spec(job_id: str, priority: int = 0, submitted: float = 0.0, gpus: int = 2) -> JobSpec:
    return job_spec(job_id=job_id, priority=priority, submitted_at=at(submitted), gpu_count=gpus)


def test_schedule_orders_by_priority_then_age() -> None:
    pending = [_spec("old-low", 0, 0), _spec("new-high", 9, 5), _spec("old-high", 9, 1)]

    decisions = schedule(Snapshot((node("a1", gpus=4),)), pending, at(10))

    assert [d.job_id for d in decisions] == ["old-high", "new-high", "old-low"]
    assert [type(d) for d in decisions] == [Place, Place, Unschedulable]


def test_schedule_does_not_double_book() -> None:
    decisions = schedule(Snapshot((node("a1", gpus=2), node("a2", gpus=2))), [_spec("j1"), _spec("j2")], at(0))

    assert all(isinstance(d, Place) for d in decisions)
    taken = [(p.node_id, p.gpu_indices) for d in decisions if isinstance(d, Place) for p in d.placements]
    assert len(taken) == len(set(taken)) == 4


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        pytest.param({"free_memory_bytes": 64 * GIB}, "insufficient memory", id="memory"),
        pytest.param({"free_cpu_cores": 8.0}, "insufficient CPU", id="cpu"),
        pytest.param({"rendezvous_ports": (29500,)}, "no free rendezvous port", id="port"),
    ],
)
def test_schedule_accounts_what_earlier_jobs_of_the_cycle_took(overrides: dict[str, object], why: str) -> None:
    snapshot = Snapshot((node("a1", gpus=8, **overrides),))

    first, second = schedule(snapshot, [_spec("j1", submitted=0), _spec("j2", submitted=1)], at(0))

    assert isinstance(first, Place)
    assert isinstance(second, Unschedulable)
    assert why in second.node_counts
