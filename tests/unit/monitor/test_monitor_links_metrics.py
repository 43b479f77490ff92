"""The monitor's /metrics of measured links: RTTs measured where measured and estimated only elsewhere, bounded
beyond 16 live nodes to the worst links, means over measured RTTs, bandwidth, slow links, and each rank's transfer
rate in its last sync."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shardyard.events import JobAccepted, JobReady, JobRunning, NodeStatus
from shardyard.monitor.metrics import MonitorMetrics, make_registry, mean_rtt_ms
from shardyard.monitor.network import WORST_LINKS
from shardyard.monitor.telemetry import Telemetry
from shardyard.monitor.views import ClusterView
from tests.support.clock import FakeClock
from tests.unit.builders import at, job_spec, node_state, progress, scheduled
from tests.unit.monitor.test_monitor_links import FAST, SLOW, measured, round_of

RTT = "shardyard_node_rtt_seconds"


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of ``name``, by its labels."""
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def scrape(clock: FakeClock, *events: object, nodes: int = 4, zones: int = 1) -> str:
    view = ClusterView(telemetry=Telemetry(clock=clock))
    for i in range(1, nodes + 1):
        view.apply(node_state(f"n{i}", topology={"zone": f"z{i % zones}", "rack": "r1"}))
    for event in events:
        view.apply(event)
    return MonitorMetrics(view).exposition().decode()


def rtt(text: str, a: str, b: str) -> tuple[str, float] | None:
    found = [
        (dict(k)["source"], v) for k, v in samples(text, RTT).items() if (dict(k)["node"], dict(k)["peer"]) == (a, b)
    ]
    return found[0] if found else None


def test_measured_pairs_are_measured_and_the_others_estimated() -> None:
    text = scrape(FakeClock(at(0)), measured("n1", "n2", 0.25, 0), measured("n2", "n1", 0.35, 0))

    assert rtt(text, "n1", "n2") == ("measured", pytest.approx(0.00025))  # the lower of both directions
    assert rtt(text, "n1", "n3") == ("topology", pytest.approx(0.0001))  # same rack, not measured
    assert rtt(text, "n2", "n1") is None  # each pair once
    assert len(samples(text, RTT)) == 6


def test_stale_measurements_give_way_to_the_estimate() -> None:
    text = scrape(FakeClock(at(121)), measured("n1", "n2", 5.0, 0))

    assert rtt(text, "n1", "n2") == ("topology", pytest.approx(0.0001))


def test_means_use_measured_rtts_where_known() -> None:
    clock = FakeClock(at(0))
    text = scrape(clock, *round_of(0))
    means = {
        dict(k)["node"]: (dict(k)["source"], v) for k, v in samples(text, "shardyard_node_mean_rtt_seconds").items()
    }

    assert means["n4"] == ("measured", pytest.approx(SLOW / 1000))
    assert means["n1"] == ("measured", pytest.approx((2 * FAST + SLOW) / 3 / 1000))
    partly = scrape(clock, measured("n1", "n2", 3.0, 0))
    mixed = {
        dict(k)["node"]: (dict(k)["source"], v) for k, v in samples(partly, "shardyard_node_mean_rtt_seconds").items()
    }
    assert mixed["n1"] == ("mixed", pytest.approx((3.0 + 0.1 + 0.1) / 3 / 1000))
    assert mixed["n3"] == ("topology", pytest.approx(0.1 / 1000))


def test_bandwidth_and_slow_links_are_exported_per_pair() -> None:
    text = scrape(FakeClock(at(0)), *round_of(0))

    widths = samples(text, "shardyard_link_bandwidth_bytes_per_second")
    assert len(widths) == 6 and set(widths.values()) == {1e9}
    assert sorted(dict(k)["node"] + "|" + dict(k)["peer"] for k in samples(text, "shardyard_link_slow")) == [
        "n1|n4",
        "n2|n4",
        "n3|n4",
    ]


def test_beyond_16_live_nodes_only_the_worst_measured_links_and_the_means() -> None:
    names = tuple(f"n{i}" for i in range(1, 21))
    events = [measured(a, b, 10.0 + i if "n20" in (a, b) else FAST, 0) for i, a in enumerate(names) for b in names]
    text = scrape(FakeClock(at(0)), *[e for e in events if e.node_id != e.peer_id], nodes=20)

    shown = samples(text, RTT)
    assert len(shown) == WORST_LINKS and {dict(k)["source"] for k in shown} == {"measured"}
    assert sum(1 for k in shown if "n20" in (dict(k)["node"], dict(k)["peer"])) == 19  # its slow links, all of them
    assert len(samples(text, "shardyard_node_mean_rtt_seconds")) == 20


def test_the_registry_serves_the_same_families() -> None:
    view = ClusterView(telemetry=Telemetry(clock=FakeClock(at(0))))
    for event in round_of(0):
        view.apply(event)
    text = generate_latest(make_registry(view)[0]).decode()

    assert len(samples(text, "shardyard_link_slow")) == 3


def test_a_lost_nodes_links_are_not_exported() -> None:
    text = scrape(FakeClock(at(0)), *round_of(0), node_state("n4", status=NodeStatus.LOST))

    assert not [k for k in samples(text, RTT) if "n4" in (dict(k)["node"], dict(k)["peer"])]
    assert samples(text, "shardyard_link_slow") == {}  # three nodes left, all in line


def test_mean_rtt_ms_keeps_its_estimate_only_form() -> None:
    states = [node_state(f"n{i}", topology={"zone": "z", "rack": "r"}) for i in range(3)]

    assert mean_rtt_ms(states) == pytest.approx({"n0": 0.1, "n1": 0.1, "n2": 0.1})
    assert mean_rtt_ms(states, {("n0", "n1"): 1.1}) == pytest.approx({"n0": 0.6, "n1": 0.6, "n2": 0.1})


def test_each_ranks_transfer_rate_in_its_last_sync() -> None:
    spec = job_spec(job_id="j")
    text = scrape(
        FakeClock(at(0)),
        JobAccepted(occurred_at=at(0), job_id="j", spec=spec, source_offset="s/0/0"),
        JobReady(occurred_at=at(0), job_id="j", spec=spec),
        scheduled("j", "n1", "n2"),
        JobRunning(occurred_at=at(0), job_id="j", attempt=1),
        progress("j", 0, node_id="n1", syncs=2, allreduce_ms=40.0, allreduce_bytes=20_000_000),
        progress("j", 1, node_id="n2", syncs=2, allreduce_ms=80.0, allreduce_bytes=20_000_000),
        progress("j", 2, node_id="n2", syncs=0),  # no sync yet: no rate
    )

    rates = {
        tuple(v for _k, v in key): value
        for key, value in samples(text, "shardyard_shard_sync_bytes_per_second").items()
    }
    assert rates == {("j", "n1", "0"): pytest.approx(5e8), ("j", "n2", "1"): pytest.approx(2.5e8)}
