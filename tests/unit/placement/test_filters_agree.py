"""Placing and explaining read one filter table (``placement.filters``), so they agree node by node: a node that
explain counts under a filter is one the placement walk never yields, the nodes explain lets through are exactly
those the walk yields, with the same shards each, and explain finds the gang fits exactly when placement places it
(one case, where placement picks members without a port though another node has one, is marked as known).

Which filter explain counts a node under is found from explain alone: explain the same cluster without that node,
and the count it leaves behind is its own. Each case says what that must be, so every filter of the table is met.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest

from shardyard.events import NodeStatus
from shardyard.placement import filters
from shardyard.placement.candidate import Candidate
from shardyard.placement.contention import explain, tally
from shardyard.placement.gang_placement import Links, place_gang, walk
from shardyard.placement.index import ClusterIndex
from shardyard.placement.model import NodeView, PendingJob, Policy
from tests.unit.builders import GIB, at
from tests.unit.placement_support import node, pending


@dataclass(frozen=True)
class Case:
    nodes: tuple[NodeView, ...]
    stopped: dict[str, str]
    """Node id -> the filter explain counts it under; the nodes not named pass every filter."""
    gang: str | None = None
    """The gang filter the passing nodes fail (None: the gang fits)."""
    job: PendingJob = field(default_factory=pending)
    """Two shards of A100 (35 TFLOPS), 32 GiB and 4 cores each."""
    reserved: frozenset[str] = frozenset()
    """Nodes a higher-priority job reserved earlier in the cycle."""
    quota_models: frozenset[str] | None = None
    """The GPU models the job's queue has quota for (None: no queues)."""


def failing_each_filter() -> tuple[NodeView, ...]:
    """One node failing each state, group, bucket and node filter of a full-match job, in table order."""
    return (
        node("dead", status=NodeStatus.LOST),
        node("drain", draining=True),
        node("v100", "V100"),
        node("slow", tflops=20.0),
        node("hot", cpu_load=0.7),
        node("full", disk_free_bytes=GIB // 2),
        node("held"),
        node("busy", free_gpus=()),
        node("lost-before"),
        node("small", free_memory_bytes=GIB),
        node("starved", free_cpu_cores=1.0),
        node("bare", artifacts={}),
    )


MIXED_STOPS = {
    "dead": filters.NOT_ALIVE,
    "drain": filters.DRAINING,
    "v100": filters.MODEL,
    "slow": filters.TFLOPS,
    "hot": filters.LOAD,
    "full": filters.DISK,
    "held": filters.RESERVED,
    "busy": filters.NO_GPU,
    "lost-before": filters.EXCLUDED,
    "small": filters.MEMORY,
    "starved": filters.CPU,
    "bare": filters.ARTIFACT,
}

CASES = {
    "passing": Case((node("a1"), node("a2", gpus=1)), {}),
    "not-alive": Case((node("a1", status=NodeStatus.SUSPECT), node("a2")), {"a1": filters.NOT_ALIVE}),
    "draining": Case((node("a1", draining=True), node("a2")), {"a1": filters.DRAINING}),
    "model": Case((node("v1", "V100", 4), node("a2")), {"v1": filters.MODEL}),
    "tflops": Case((node("a1", tflops=20.0), node("a2")), {"a1": filters.TFLOPS}),
    "match-below-the-degraded-floor": Case(
        (node("v1", "V100", 4),), {"v1": filters.MATCH}, filters.TOO_FEW, pending(min_match=0.5, max_wait_s=0)
    ),
    "quota": Case(
        (node("h1", "H100"), node("a1"), node("a2")),
        {"h1": filters.QUOTA},
        job=pending(gpu_model=None, min_tflops=30.0),
        quota_models=frozenset({"A100"}),
    ),
    "load": Case((node("a1", cpu_load=0.5), node("a2")), {"a1": filters.LOAD}),
    "disk-below-the-floor": Case(
        (node("a1", disk_free_bytes=GIB - 1), node("a2", disk_free_bytes=GIB), node("a3")), {"a1": filters.DISK}
    ),
    "reserved": Case((node("a1"), node("a2")), {"a1": filters.RESERVED}, reserved=frozenset({"a1"})),
    "no-free-gpu": Case((node("a1", free_gpus=()), node("a2")), {"a1": filters.NO_GPU}),
    "excluded": Case((node("a1"), node("a2")), {"a1": filters.EXCLUDED}, job=pending(excluded_nodes={"a1"})),
    "memory": Case((node("a1", free_memory_bytes=16 * GIB), node("a2")), {"a1": filters.MEMORY}),
    "cpu": Case((node("a1", free_cpu_cores=2.0), node("a2")), {"a1": filters.CPU}),
    "artifact": Case((node("a1", artifacts={}), node("a2")), {"a1": filters.ARTIFACT}),
    "too-few": Case((node("a1", gpus=1),), {}, filters.TOO_FEW),
    "no-port": Case((node("a1", rendezvous_ports=()),), {}, filters.NO_PORT),
    "mixed-fits": Case(
        (*failing_each_filter(), node("a1", gpus=1), node("a2", gpus=1)),
        MIXED_STOPS,
        job=pending(excluded_nodes={"lost-before"}),
        reserved=frozenset({"held"}),
    ),
    "mixed-too-few": Case(
        (*failing_each_filter(), node("a1", gpus=1)),
        MIXED_STOPS,
        filters.TOO_FEW,
        pending(excluded_nodes={"lost-before"}),
        frozenset({"held"}),
    ),
}
PARAMS = [pytest.param(case, id=name) for name, case in CASES.items()]


def candidate_on(case: Case, *, without: str | None = None) -> tuple[ClusterIndex, Candidate]:
    """A fresh index of the case's nodes (less ``without``), its reservations made, and the job on it."""
    index = ClusterIndex([view for view in case.nodes if view.node_id != without], Policy())
    for node_id in sorted(case.reserved & index.slots.keys()):
        index.reserve(index.slots[node_id], "job-0")
    return index, Candidate(case.job, index, at(1), case.quota_models)


def stopped_by(case: Case) -> dict[str, str]:
    """Node id -> the filter explain counts it under: the count explaining without it is short of."""
    everyone = Counter(tally(*candidate_on(case)).counts)
    stopped = {}
    for view in case.nodes:
        others = Counter(tally(*candidate_on(case, without=view.node_id)).counts)
        assert not others - everyone, "leaving a node out adds to no count"
        own = everyone - others
        assert sum(own.values()) <= 1, f"{view.node_id} counts under one filter or none: {own}"
        if own:
            (stopped[view.node_id],) = own
    return stopped


@pytest.mark.parametrize("case", PARAMS)
def test_a_node_explain_counts_under_a_filter_is_one_placement_never_walks(case: Case) -> None:
    stopped = stopped_by(case)
    walked = {slot.node_id: shards for _key, slot, shards in walk(*candidate_on(case))}
    passing = {slot.node_id: shards for slot, shards in tally(*candidate_on(case)).passing}

    assert stopped == case.stopped
    assert not walked.keys() & stopped.keys()
    assert passing == walked
    assert walked.keys() == {view.node_id for view in case.nodes} - stopped.keys()


@pytest.mark.parametrize(
    "case",
    [
        *PARAMS,
        pytest.param(
            Case((node("a1", cpu_load=0.0, rendezvous_ports=()), node("a2")), {}),
            id="best-ranked-member-without-a-port",  # a1 holds the gang alone but cannot host its rendezvous
        ),
    ],
)
def test_explain_finds_the_gang_fits_exactly_when_placement_places_it(case: Case) -> None:
    index, job = candidate_on(case)
    placed = place_gang(index, job, Links(topology=False)) if job.eligible else None
    counted = tally(*candidate_on(case))

    assert counted.gang is (filters.BY_NAME[case.gang] if case.gang else None)
    assert (placed is not None) == (counted.gang is None)
    if placed is not None:
        assert {shard.node_id for shard in placed.placements} <= {slot.node_id for slot, _ in counted.passing}


@pytest.mark.parametrize("case", PARAMS)
def test_the_counts_explain_reports_are_its_nodes_filters(case: Case) -> None:
    index, job = candidate_on(case)
    verdict, placeable = explain(index, job, at(1))
    passing = tally(*candidate_on(case)).passing
    # Explain runs once placing failed: the passing nodes count under the gang filter that failed (the last if none).
    gang = case.gang or filters.GANG_FILTERS[-1].name
    expected = Counter(case.stopped.values()) + Counter({gang: len(passing)})

    assert verdict.node_counts == {filters.BY_NAME[name].label(Policy()): n for name, n in expected.items()}
    assert placeable == sum(shards for _slot, shards in passing)


LEVEL = {filters.StateFilter: 0, filters.GroupFilter: 0, filters.BucketFilter: 1, filters.NodeFilter: 2}


def test_the_table_runs_state_and_group_then_bucket_then_node_then_gang_filters() -> None:
    # The index holds back the nodes that fail a state filter before any bucket or node filter is asked of them.
    levels = [LEVEL.get(type(f), 3) for f in filters.FILTERS]

    assert levels == sorted(levels)
    assert len(filters.BY_NAME) == len(filters.FILTERS)


def test_every_filter_has_a_case() -> None:
    met = {name for case in CASES.values() for name in case.stopped.values()}
    met |= {case.gang for case in CASES.values() if case.gang}

    assert met == set(filters.BY_NAME)


@pytest.mark.parametrize("topology", [False, True])
def test_a_gang_whose_best_node_cannot_host_its_rendezvous_meets_on_one_that_can(topology: bool) -> None:
    index, job = candidate_on(Case((node("a1", cpu_load=0.0, rendezvous_ports=()), node("a2")), {}))

    placed = place_gang(index, job, Links(topology=topology))

    assert placed is not None
    assert placed.coordinator_node == "a2"
    assert len([p for p in placed.placements if not p.spare]) == job.k
