"""The placement core's filters, the match score, and the typed reason with per-filter node counts."""

from __future__ import annotations

import pytest

from shardyard.events import NodeStatus, PendingReason
from shardyard.placement.model import NodeView, Policy
from tests.unit.builders import GIB
from tests.unit.placement_support import blocked, decide, node, only, pending, placed_on

V100S = [node("v1", "V100", 4), node("v2", "V100", 4)]


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        pytest.param([*V100S, node("a1", gpus=2)], ["a1", "a1"], id="a100-among-v100s"),
        pytest.param([*V100S, node("a1", gpus=1), node("a2", gpus=1)], ["a1", "a2"], id="split-over-a100s"),
        pytest.param([node("a1", "NVIDIA A100-SXM4-80GB")], ["a1", "a1"], id="nvml-model-name"),
        pytest.param(
            [node("a1", status=NodeStatus.SUSPECT), node("a2", status=NodeStatus.LOST), node("a3")],
            ["a3", "a3"],
            id="only-alive-nodes",
        ),
        pytest.param([node("a1", draining=True), node("a2")], ["a2", "a2"], id="not-draining"),
        pytest.param([node("a1", cpu_load=0.5), node("a2", cpu_load=0.45)], ["a2", "a2"], id="load-below-50pct"),
        pytest.param(
            [node("a1", cpu_load=0.0, disk_free_bytes=GIB // 2), node("a2", disk_free_bytes=GIB)],
            ["a2", "a2"],
            id="output-disk-above-the-floor",
        ),
        pytest.param([node("a1", disk_free_bytes=None)], ["a1", "a1"], id="output-disk-not-reported"),
        pytest.param([node("a1", free_memory_bytes=16 * GIB), node("a2")], ["a2", "a2"], id="memory-filter"),
        pytest.param([node("a1", free_memory_bytes=32 * GIB), node("a2", gpus=1)], ["a1", "a2"], id="memory-caps"),
        pytest.param([node("a1", free_cpu_cores=2.0), node("a2")], ["a2", "a2"], id="cpu-filter"),
        pytest.param([node("a1", free_cpu_cores=4.0), node("a2", gpus=1)], ["a1", "a2"], id="cpu-caps"),
        pytest.param([node("a1", free_gpus=()), node("a2")], ["a2", "a2"], id="no-free-gpu"),
        pytest.param([node("a1", artifacts={}), node("a2")], ["a2", "a2"], id="artifacts-present"),
        pytest.param(
            [node("a1", artifacts={"/data/models/gpt2": "local"}), node("a2")], ["a2", "a2"], id="both-artifacts"
        ),
        pytest.param([node("h1", "H100", 2)], ["h1", "h1"], id="faster-model-when-model-unnamed"),
    ],
)
def test_filters(nodes: list[NodeView], expected: list[str]) -> None:
    job = pending(gpu_model=None) if expected[0].startswith("h") else pending()

    assert placed_on(only(nodes, job)) == expected


def test_excluded_nodes_are_skipped() -> None:
    job = pending(excluded_nodes={"a1"})

    assert placed_on(only([node("a1"), node("a2")], job)) == ["a2", "a2"]


def test_tflops_floor_applies_without_a_model() -> None:
    job = pending(gpu_model=None, min_tflops=30.0)

    assert placed_on(only([node("v1", "V100", 4), node("a1")], job)) == ["a1", "a1"]


@pytest.mark.parametrize(
    ("tflops", "required", "score"),
    [
        pytest.param(35.0, 35.0, 1.0, id="a100-for-a100-job"),
        pytest.param(67.0, 35.0, 1.0, id="faster-caps-at-1"),
        pytest.param(15.0, 35.0, 0.4286, id="v100-for-a100-job"),
    ],
)
def test_match_score_is_reported_per_shard(tflops: float, required: float, score: float) -> None:
    job = pending(gpu_model=None, min_tflops=required, min_match=0.1, gpu_count=1)

    decision = only([node("n1", tflops=tflops)], job)

    assert [p.match_score for p in decision.placements] == [score]  # type: ignore[union-attr]


def test_gang_is_all_or_nothing() -> None:
    decision = blocked(only([node("a1", gpus=4, free_gpus=(0,))], pending(gpu_count=3)))

    assert decision.reason is PendingReason.INSUFFICIENT_GPUS
    assert decision.node_counts == {"fewer free GPUs than shards": 1}


REASONS = [
    pytest.param([], PendingReason.NO_NODES, {}, id="no-nodes"),
    # The job's kind is in the cluster but down: a wait that a node coming back cures (all gone: NEVER_FITS).
    pytest.param(
        [*V100S, node("a9", status=NodeStatus.LOST)],
        PendingReason.GPU_MODEL_MISMATCH,
        {"GPU model mismatch": 2, "node not alive": 1},
        id="model",
    ),
    pytest.param(
        [node("a1", tflops=20.0), node("a9", status=NodeStatus.LOST)],
        PendingReason.INSUFFICIENT_TFLOPS,
        {"TFLOPS below minimum": 1, "node not alive": 1},
        id="tflops",
    ),
    pytest.param(
        [node("a1", status=NodeStatus.LOST), node("a2", draining=True)],
        PendingReason.NO_FIT,
        {"node not alive": 1, "node draining": 1},
        id="dead-or-draining",
    ),
    pytest.param(
        [*V100S, node("a1", cpu_load=0.7)],
        PendingReason.LOAD_TOO_HIGH,
        {"GPU model mismatch": 2, "load above 50%": 1},
        id="load",
    ),
    pytest.param(
        [*V100S, node("a1", free_gpus=())],
        PendingReason.INSUFFICIENT_GPUS,
        {"GPU model mismatch": 2, "no free GPU": 1},
        id="busy",
    ),
    pytest.param(
        [node("a1", free_memory_bytes=GIB)], PendingReason.INSUFFICIENT_MEMORY, {"insufficient memory": 1}, id="mem"
    ),
    pytest.param([node("a1", free_cpu_cores=1.0)], PendingReason.INSUFFICIENT_CPU, {"insufficient CPU": 1}, id="cpu"),
    pytest.param(
        [node("a1", artifacts={}), *V100S],
        PendingReason.WAITING_FOR_ARTIFACT,
        {"GPU model mismatch": 2, "model or dataset absent": 1},
        id="artifact",
    ),
    pytest.param(
        [node("a1", disk_free_bytes=0), node("a2", gpus=1, free_gpus=())],
        PendingReason.DISK_FULL,
        {"output disk below 1GiB free": 1, "no free GPU": 1},
        id="disk",
    ),
]


@pytest.mark.parametrize(("nodes", "reason", "counts"), REASONS)
def test_every_reason(nodes: list[NodeView], reason: PendingReason, counts: dict[str, int]) -> None:
    decision = blocked(only(nodes))

    assert decision.reason is reason
    assert decision.node_counts == counts


def test_reason_message_lists_counts_largest_first() -> None:
    nodes = [node(f"v{i}", "V100") for i in range(25)]
    nodes += [node(f"b{i}", free_gpus=()) for i in range(10)]
    nodes += [node(f"l{i}", cpu_load=0.8) for i in range(5)]

    decision = blocked(only(nodes))

    assert decision.reason is PendingReason.LOAD_TOO_HIGH
    assert decision.message.endswith(": 25 GPU model mismatch, 10 no free GPU, 5 load above 50%")
    assert decision.message.startswith("0/40 nodes can take the gang of 2 x A100 (>= 35 TFLOPS)")


def test_a_job_that_waits_for_disk_space_hears_which_disks_are_full() -> None:
    nodes = [node("a2", disk_free_bytes=3 * 2**20), node("a1", disk_free_bytes=0), node("v1", "V100", 4)]
    nodes.append(node("v2", "V100", 4, disk_free_bytes=0))  # not the job's kind: not named

    decision = blocked(only(nodes))

    assert decision.reason is PendingReason.DISK_FULL
    assert decision.message.endswith("; output disks below 1GiB free: a1 (0B free), a2 (3MiB free)")


def test_the_disk_floor_is_a_policy_knob() -> None:
    decision = only([node("a1", disk_free_bytes=64 * 2**20)], policy=Policy(disk_floor_bytes=16 * 2**20))

    assert placed_on(decision) == ["a1", "a1"]


def test_load_threshold_is_a_policy_knob() -> None:
    decision = only([node("a1", cpu_load=0.7)], policy=Policy(load_threshold=0.8))

    assert placed_on(decision) == ["a1", "a1"]


def test_excluded_nodes_are_counted() -> None:
    decision = blocked(only([node("a1")], pending(excluded_nodes={"a1"})))

    assert decision.node_counts == {"excluded after a failure": 1}


class TestDegraded:
    """A job that opted in accepts a lower match after max_wait_s, and says so; never silently."""

    def test_without_opt_in_a100_job_waits_on_v100s(self) -> None:
        decision = blocked(only([*V100S, node("a9", status=NodeStatus.LOST)], pending(), now=3600))

        assert decision.reason is PendingReason.GPU_MODEL_MISMATCH

    def test_opted_in_waits_for_max_wait_first_and_says_when(self) -> None:
        decision = blocked(only(V100S, pending(min_match=0.4, max_wait_s=30), now=10))

        assert decision.reason is PendingReason.GPU_MODEL_MISMATCH
        assert "degraded placement (match >= 0.4) allowed in 20s" in decision.message

    def test_after_max_wait_runs_degraded(self) -> None:
        decision = only(V100S, pending(min_match=0.4, max_wait_s=30), now=31)

        assert placed_on(decision) == ["v1", "v1"]
        assert decision.degraded  # type: ignore[union-attr]
        assert {(p.match_score, p.degraded) for p in decision.placements} == {(0.4286, True)}  # type: ignore[union-attr]

    def test_floor_is_respected(self) -> None:
        decision = blocked(only(V100S, pending(min_match=0.5, max_wait_s=0)))

        assert decision.node_counts == {"match below min_match": 2}

    def test_full_match_still_preferred_and_not_degraded(self) -> None:
        decision = only([*V100S, node("a1")], pending(min_match=0.4, max_wait_s=0))

        assert placed_on(decision) == ["a1", "a1"]
        assert not decision.degraded  # type: ignore[union-attr]


def test_several_jobs_in_one_cycle_do_not_share_gpus() -> None:
    decisions = decide([node("a1", gpus=4)], [pending("j1"), pending("j2"), pending("j3")])

    assert [placed_on(d) for d in decisions[:2]] == [["a1", "a1"], ["a1", "a1"]]
    gpus = [p.gpu_indices for d in decisions[:2] for p in d.placements]  # type: ignore[union-attr]
    assert sorted(gpus) == [(0,), (1,), (2,), (3,)]
    assert blocked(decisions[2]).reason is PendingReason.INSUFFICIENT_GPUS
