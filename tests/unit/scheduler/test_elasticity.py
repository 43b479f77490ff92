"""Capacity requests and reclaim candidates for an autoscaler."""

from __future__ import annotations

from shardyard.events import CapacityRequested, NodeStatus, PendingReason, ReclaimCandidate
from shardyard.scheduler.elasticity import ElasticityTracker
from tests.unit.builders import at, gpus, job_spec, node_state

A = job_spec(job_id="a", gpu_count=2)
B = job_spec(job_id="b", gpu_count=1)
NODES = {"v1": node_state("v1", gpus=gpus("V100", 2, 15.0))}


def test_blocked_jobs_become_one_capacity_request_per_gpu_kind() -> None:
    tracker = ElasticityTracker()

    (request,) = tracker.observe(
        [(A, PendingReason.INSUFFICIENT_GPUS, at(0)), (B, PendingReason.GPU_MODEL_MISMATCH, at(20))], {}, set(), at(40)
    )

    assert isinstance(request, CapacityRequested)
    assert (request.gpu_model, request.gpus, request.jobs, request.waiting_s) == ("A100", 3, ("a", "b"), 40.0)


def test_unchanged_demand_repeats_only_after_repeat_s() -> None:
    tracker = ElasticityTracker(repeat_s=30)
    blocked = [(A, PendingReason.INSUFFICIENT_GPUS, at(0))]

    first = tracker.observe(blocked, {}, set(), at(1))
    again = tracker.observe(blocked, {}, set(), at(20))
    later = tracker.observe(blocked, {}, set(), at(31))

    assert len(first) == 1 and again == [] and len(later) == 1


def test_reasons_more_nodes_would_not_cure_ask_for_nothing() -> None:
    tracker = ElasticityTracker()

    assert tracker.observe([(A, PendingReason.WAITING_FOR_ARTIFACT, at(0))], {}, set(), at(10)) == []


def test_an_idle_node_nobody_waits_for_is_a_reclaim_candidate_once() -> None:
    tracker = ElasticityTracker(reclaim_after_s=300)

    assert tracker.observe([], NODES, set(), at(0)) == []
    (candidate,) = tracker.observe([], NODES, set(), at(300))
    assert isinstance(candidate, ReclaimCandidate)
    assert (candidate.node_id, candidate.gpu_model, candidate.gpus, candidate.idle_s) == ("v1", "V100", 2, 300.0)
    assert tracker.observe([], NODES, set(), at(400)) == []


def test_busy_dead_or_wanted_nodes_are_not_reclaimed() -> None:
    tracker = ElasticityTracker(reclaim_after_s=0)
    lost = {"v1": node_state("v1", gpus=gpus("V100", 2, 15.0), status=NodeStatus.LOST)}
    any_gpu = job_spec(job_id="any", gpu_model=None, min_tflops=0.0)

    assert tracker.observe([], NODES, {"v1"}, at(1)) == []
    assert tracker.observe([], lost, set(), at(2)) == []
    wanted = tracker.observe([(any_gpu, PendingReason.INSUFFICIENT_GPUS, at(0))], NODES, set(), at(3))
    assert [type(e) for e in wanted] == [CapacityRequested]
