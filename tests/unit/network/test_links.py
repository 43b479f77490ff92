"""Measured links, pure: whom a node probes, one figure per pair, slow links; and what placement makes of them."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

import pytest

from shardyard.events import LinkMeasured
from shardyard.links import LinkTable, peers_to_probe, slow_links
from shardyard.placement.cycle import schedule
from shardyard.placement.model import Place, Snapshot
from tests.unit.builders import at
from tests.unit.placement_support import node, pending


def measured(node_id: str, peer: str, rtt: float, *, when: float = 0.0, width: float | None = None) -> LinkMeasured:
    return LinkMeasured(
        occurred_at=at(when),
        node_id=node_id,
        peer_id=peer,
        rtt_median_ms=rtt,
        rtt_p90_ms=rtt * 1.2,
        samples=8,
        bandwidth_bytes_per_s=width,
        burst_bytes=1024 if width else 0,
    )


# --- whom a node probes --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [10, 100, 1000])
def test_a_round_probes_the_gang_peers_and_k_others_and_the_sample_covers_everyone(n: int) -> None:
    others = [f"n{i}" for i in range(n)]
    k = 8
    gang = {"n1", "n2"}
    seen: set[str] = set()
    rounds = math.ceil((n - 1 - len(gang)) / k)
    for round_no in range(rounds):
        chosen = peers_to_probe("n0", others, gang, k, round_no)
        assert chosen[:2] == ["n1", "n2"]
        assert len(chosen) == len(gang) + min(k, n - 1 - len(gang))  # O(k), at any n
        assert "n0" not in chosen
        seen.update(chosen)
    assert seen == set(others) - {"n0"}  # every link within ceil((n - 1 - gang) / k) rounds


def test_two_nodes_walk_their_samples_in_different_orders() -> None:
    others = [f"n{i}" for i in range(50)]
    assert peers_to_probe("n0", others, (), 8, 0) != peers_to_probe("n1", others, (), 8, 0)


# --- one figure per pair -------------------------------------------------------------------------------------------


def test_a_pair_is_the_lower_of_its_fresh_directions_rtt_and_bandwidth() -> None:
    table = LinkTable(max_age_s=60)
    table.apply(measured("a", "b", 2.0, width=100.0))
    table.apply(measured("b", "a", 4.0, when=1, width=50.0))
    table.apply(measured("a", "c", 9.0, when=-100))  # stale at t=1
    (link,) = table.links(at(1)).values()
    assert (link.a, link.b, link.rtt_ms, link.bandwidth_bytes_per_s) == ("a", "b", 2.0, 50.0)
    assert table.rtt_ms(at(1)) == {("a", "b"): 2.0}


def test_an_older_measurement_read_late_does_not_replace_a_newer_one() -> None:
    table = LinkTable()
    table.apply(measured("a", "b", 2.0, when=5))
    table.apply(measured("a", "b", 30.0, when=1))
    assert table.rtt_ms(at(5)) == {("a", "b"): 2.0}


def test_a_burst_figure_outlives_the_rounds_without_one_and_a_lost_node_is_forgotten() -> None:
    table = LinkTable()
    table.apply(measured("a", "b", 2.0, width=100.0))
    table.apply(measured("a", "b", 2.0, when=10))
    assert table.links(at(10))[("a", "b")].bandwidth_bytes_per_s == 100.0
    table.forget("b")
    assert table.links(at(10)) == {}


# --- slow links ----------------------------------------------------------------------------------------------------


def links_of(rtts: dict[tuple[str, str], float], widths: dict[tuple[str, str], float] | None = None) -> LinkTable:
    table = LinkTable()
    for (a, b), rtt in rtts.items():
        table.apply(measured(a, b, rtt, width=(widths or {}).get((a, b))))
    return table


def test_the_links_of_a_node_with_a_slow_access_link_are_slow_and_no_other() -> None:
    table = links_of({("a", "b"): 20.2, ("b", "c"): 20.2, ("a", "c"): 0.4})
    found = slow_links(list(table.links(at(0)).values()))
    assert {(s.link.a, s.link.b) for s in found} == {("a", "b"), ("b", "c")}
    assert "20.2 ms" in found[0].why


def test_small_differences_between_fast_links_are_not_slow() -> None:
    table = links_of({("a", "b"): 0.05, ("b", "c"): 0.4, ("a", "c"): 0.05, ("c", "d"): 0.3, ("b", "d"): 4.3})
    assert slow_links(list(table.links(at(0)).values())) == []


def test_a_link_with_a_third_of_the_clusters_bandwidth_is_slow() -> None:
    rtts = {("a", "b"): 0.3, ("b", "c"): 0.3, ("a", "c"): 0.3, ("c", "d"): 0.3}
    widths = {("a", "b"): 1e9, ("b", "c"): 1e9, ("a", "c"): 1e9, ("c", "d"): 2e8}
    (slow,) = slow_links(list(links_of(rtts, widths).links(at(0)).values()))
    assert (slow.link.a, slow.link.b) == ("c", "d")
    assert "MB/s" in slow.why


def test_two_nodes_have_nothing_to_compare_their_link_with() -> None:
    assert slow_links(list(links_of({("a", "b"): 50.0}).links(at(0)).values())) == []


# --- placement on measured links -----------------------------------------------------------------------------------


def place(snapshot: Snapshot, gpus: int = 2) -> Place:
    (decision,) = schedule(snapshot, [pending(gpu_count=gpus)], None, now=at(1))
    assert isinstance(decision, Place), decision
    return decision


def test_of_two_members_the_one_better_connected_to_the_cluster_coordinates_on_measured_rtts() -> None:
    nodes = (node("a", gpus=1), node("b", gpus=1), node("c", "V100", gpus=1))
    rtt = {("a", "b"): 20.2, ("b", "c"): 20.2, ("a", "c"): 0.4}
    for first in ("a", "b"):  # whichever the walk meets first
        ordered = tuple(sorted(nodes, key=lambda v: v.node_id != first))
        decision = place(Snapshot(ordered, rtt_ms=rtt, mean_rtt_ms={"a": 10.3, "b": 20.2, "c": 10.3}))
        assert decision.coordinator_node == "a"
        assert decision.coordinator_source == "measured"


def test_the_source_says_labels_when_nothing_is_measured_and_single_node_when_one_node_holds_the_gang() -> None:
    labelled = (node("a", gpus=1, zone="z1"), node("b", gpus=1, zone="z1"))
    assert place(Snapshot(labelled)).coordinator_source == "topology"
    assert place(Snapshot((node("a", gpus=2),))).coordinator_source == "single-node"
    partly = Snapshot((node("a", gpus=1), node("b", gpus=1), node("c", gpus=1)), rtt_ms={("a", "b"): 0.3})
    assert place(partly, gpus=3).coordinator_source == "mixed"


def test_a_gang_spread_over_nodes_is_placed_off_a_slow_node_when_it_fits_elsewhere() -> None:
    nodes = (node("b", gpus=1, cpu_load=0.0), node("a", gpus=1, cpu_load=0.3), node("c", gpus=1, cpu_load=0.3))
    assert set(n.node_id for n in place(Snapshot(nodes)).placements) == {"a", "b"}  # b is the least loaded
    slow = Snapshot(nodes, slow_nodes=frozenset({"b"}))
    assert {p.node_id for p in place(slow).placements} == {"a", "c"}


def test_a_slow_node_is_used_when_the_gang_fits_nowhere_else_or_alone_on_it() -> None:
    nodes = (node("a", gpus=1), node("b", gpus=1))
    assert {p.node_id for p in place(Snapshot(nodes, slow_nodes=frozenset({"b"}))).placements} == {"a", "b"}
    alone = (node("b", gpus=2, cpu_load=0.0), replace(node("a", gpus=2), cpu_load=0.3))
    assert {p.node_id for p in place(Snapshot(alone, slow_nodes=frozenset({"b"}))).placements} == {"b"}


def test_measurements_older_than_the_tables_age_are_not_used() -> None:
    table = LinkTable(max_age_s=30)
    table.apply(measured("a", "b", 2.0))
    assert table.rtt_ms(at(0) + timedelta(seconds=31)) == {}


def test_a_probe_port_another_process_holds_gives_way_to_a_free_one() -> None:
    import socket

    from shardyard.netprobe import bind_endpoint

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        endpoint = bind_endpoint("127.0.0.1", taken)
        try:
            assert endpoint.getsockname()[1] not in (taken, 0)
        finally:
            endpoint.close()
    free = bind_endpoint("127.0.0.1", taken)  # free again: the port asked for
    try:
        assert free.getsockname()[1] == taken
    finally:
        free.close()
