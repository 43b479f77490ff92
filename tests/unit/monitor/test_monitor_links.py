"""The monitor's measured links: the view keeps the live nodes' links from the links topic, SLOW_LINK fires after a
link has been slow for its ``for`` and resolves when it is in line again or its measurements go stale, SLOW_SYNC
names the slowest rank and link, and ``/api/links`` and a job's detail show them."""

from __future__ import annotations

from datetime import datetime

import pytest
from aiohttp.test_utils import TestClient, TestServer

from shardyard.events import (
    AlertFiring,
    AlertResolved,
    AlertRule,
    AlertSeverity,
    JobAccepted,
    JobReady,
    JobRunning,
    LinkMeasured,
    NodeLost,
    NodeStatus,
)
from shardyard.links import LinkTable
from shardyard.monitor.alerts import AlertBook
from shardyard.monitor.app import MonitorSettings
from shardyard.monitor.http import build_http
from shardyard.monitor.metrics import MonitorMetrics
from shardyard.monitor.network import Network
from shardyard.monitor.rules import AlertPolicy
from shardyard.monitor.telemetry import Telemetry
from shardyard.monitor.views import ClusterView
from tests.support.clock import FakeClock
from tests.unit.builders import at, job_spec, node_state, progress, scheduled

NODES = ("n1", "n2", "n3", "n4")
SLOW, FAST = 20.0, 0.3
"""n4's links, and every other link (ms)."""
POLICY = AlertPolicy(instance="m1", heartbeat_lag_s=3600)
"""Nodes here send no heartbeats: no HEARTBEAT_LAG beside the links' alerts."""


def measured(node: str, peer: str, rtt_ms: float, t: float, **overrides: object) -> LinkMeasured:
    fields: dict[str, object] = {
        "occurred_at": at(t),
        "node_id": node,
        "peer_id": peer,
        "rtt_median_ms": rtt_ms,
        "rtt_p90_ms": rtt_ms * 1.2,
        "samples": 10,
    }
    return LinkMeasured(**{**fields, **overrides})  # type: ignore[arg-type]


def round_of(t: float, slow_ms: float = SLOW, nodes: tuple[str, ...] = NODES) -> list[LinkMeasured]:
    """Every node probes every other at ``t``: n4's links at ``slow_ms``, the rest at FAST."""
    return [
        measured(a, b, slow_ms if "n4" in (a, b) else FAST, t, bandwidth_bytes_per_s=1e9)
        for a in nodes
        for b in nodes
        if a != b
    ]


def cluster(clock: FakeClock, *facts: object, nodes: tuple[str, ...] = NODES) -> ClusterView:
    view = ClusterView(telemetry=Telemetry(clock=clock))
    for node in nodes:
        view.apply(node_state(node, topology={"zone": "z1", "rack": "r1"}))
    for fact in facts:
        view.apply(fact)
    return view


def judge(book: AlertBook, view: ClusterView, now: datetime) -> list[AlertFiring | AlertResolved]:
    """Evaluate at ``now`` and fold what was published back into the view, as the alerts topic would."""
    out = book.evaluate(view, now)
    for event in out:
        view.apply(event)
    return [event for event in out if event.rule in (AlertRule.SLOW_LINK, AlertRule.SLOW_SYNC)]


def links_of(out: list[AlertFiring | AlertResolved]) -> list[tuple[str, str]]:
    return sorted((event.type, event.subject) for event in out if event.rule is AlertRule.SLOW_LINK)


N4_LINKS = ["n1|n4", "n2|n4", "n3|n4"]


# --- SLOW_LINK ----------------------------------------------------------------------------------------------------
def test_a_slow_link_fires_after_30_s_naming_both_nodes_and_the_figures() -> None:
    clock = FakeClock(at(0))
    view, book = cluster(clock, *round_of(0)), AlertBook(POLICY)

    assert judge(book, view, clock.now()) == []
    clock.advance(29.5)
    assert judge(book, view, clock.now()) == []
    clock.advance(0.5)
    fired = judge(book, view, clock.now())

    assert links_of(fired) == [("alert.firing", subject) for subject in N4_LINKS]
    alert = next(e for e in fired if e.subject == "n1|n4")
    assert isinstance(alert, AlertFiring)
    assert alert.summary == "the link between n1 and n4 is slow: RTT 20.0 ms, the cluster's 0.30 ms"
    assert (alert.severity, alert.value, alert.since) == (AlertSeverity.WARNING, SLOW, at(0))
    assert alert.threshold == pytest.approx(FAST + 5.0)  # 2x the 0.3 ms baseline is less than 5 ms above it


def test_a_gap_in_the_slowness_starts_the_30_s_again() -> None:
    clock = FakeClock(at(0))
    view, book = cluster(clock, *round_of(0)), AlertBook(POLICY)
    judge(book, view, clock.now())
    clock.advance(20)
    for event in round_of(20, slow_ms=FAST):
        view.apply(event)
    assert judge(book, view, clock.now()) == []  # in line again: the episode ends unfired
    clock.advance(5)
    for event in round_of(25):
        view.apply(event)
    judge(book, view, clock.now())
    clock.advance(29)

    assert judge(book, view, clock.now()) == []  # 29 s into the second episode
    clock.advance(1)
    assert len(links_of(judge(book, view, clock.now()))) == 3


def test_a_slow_link_resolves_once_in_line_again() -> None:
    clock = FakeClock(at(0))
    view, book = cluster(clock, *round_of(0)), AlertBook(POLICY)
    judge(book, view, clock.now())
    clock.advance(30)
    judge(book, view, clock.now())
    clock.advance(10)
    for event in round_of(40, slow_ms=FAST):
        view.apply(event)

    resolved = judge(book, view, clock.now())

    assert links_of(resolved) == [("alert.resolved", subject) for subject in N4_LINKS]
    assert resolved[0].summary.startswith("resolved after 40 s: the link between")


def test_a_slow_link_resolves_when_its_measurements_go_stale() -> None:
    clock = FakeClock(at(0))
    view, book = cluster(clock, *round_of(0)), AlertBook(POLICY)
    judge(book, view, clock.now())
    clock.advance(30)
    judge(book, view, clock.now())
    clock.advance(90)
    assert judge(book, view, clock.now()) == []  # 120 s old: still fresh

    clock.advance(1.5)

    assert links_of(judge(book, view, clock.now())) == [("alert.resolved", subject) for subject in N4_LINKS]


def test_two_nodes_make_no_baseline_and_no_slow_link() -> None:
    clock = FakeClock(at(0))
    view, book = cluster(clock, *round_of(0, nodes=("n1", "n4")), nodes=("n1", "n4")), AlertBook(POLICY)
    judge(book, view, clock.now())
    clock.advance(60)

    assert judge(book, view, clock.now()) == []


def test_the_settings_set_the_slow_link_figures() -> None:
    settings = MonitorSettings(
        alert_slow_link_for_s=5, link_max_age_s=10, link_slow_ratio=10, link_slow_min_excess_ms=50
    )
    network = settings.network()

    assert settings.alert_policy().slow_link_for_s == 5
    assert (network.table.max_age_s, network.slow_ratio, network.slow_min_excess_ms) == (10, 10, 50)


def test_a_higher_slow_threshold_calls_no_link_slow() -> None:
    clock = FakeClock(at(0))
    view = ClusterView(telemetry=Telemetry(clock=clock), network=Network(LinkTable(), slow_min_excess_ms=50))
    for event in round_of(0):
        view.apply(event)

    assert view.network.measured(clock.now()).slow == {}


# --- which links the view keeps -----------------------------------------------------------------------------------
def test_a_lost_nodes_links_are_forgotten_until_it_is_back() -> None:
    clock = FakeClock(at(0))
    view = cluster(clock, *round_of(0))
    view.apply(node_state("n4", status=NodeStatus.LOST, occurred_at=at(1)))
    view.apply(measured("n1", "n4", SLOW, 2))  # a late round: not kept while n4 is LOST

    assert {"n4"} & {end for pair in view.network.measured(clock.now()).links for end in pair} == set()
    view.apply(node_state("n4", occurred_at=at(3)))
    view.apply(measured("n1", "n4", SLOW, 3))
    assert ("n1", "n4") in view.network.measured(clock.now()).links


def test_node_lost_forgets_its_links_too() -> None:
    clock = FakeClock(at(0))
    view = cluster(clock, *round_of(0))
    view.apply(NodeLost(occurred_at=at(1), node_id="n4", last_heartbeat_at=at(0), silent_for_s=1))

    assert len(view.network.measured(clock.now()).links) == 3  # n1-n2, n1-n3, n2-n3


# --- SLOW_SYNC names the slowest rank and the worst link ----------------------------------------------------------
def slow_syncing_job(*gang: str) -> list[object]:
    """job-1 running on ``gang`` (a shard a node), whose syncs come at twice the 100 steps it asked for; each rank
    reported its last sync's AllReduce time: 10 ms a rank, 30 ms the last one."""
    spec = job_spec(sync_interval=100)
    facts: list[object] = [
        JobAccepted(occurred_at=at(0), job_id="job-1", spec=spec, source_offset="s/0/0"),
        JobReady(occurred_at=at(0), job_id="job-1", spec=spec),
        scheduled("job-1", *gang, occurred_at=at(0)),
        JobRunning(occurred_at=at(0), job_id="job-1", attempt=1),
    ]
    last = len(gang) - 1
    for step, syncs in ((5, 0), (102, 1), (203, 2), (405, 3)):
        for index, node in enumerate(gang):
            ms = 30.0 if index == last else 10.0
            facts.append(
                progress(shard_index=index, node_id=node, step=step, syncs=syncs, allreduce_ms=ms, occurred_at=at(1))
            )
    return facts


def test_slow_sync_names_the_slowest_rank_and_the_worst_link_of_the_gang() -> None:
    clock = FakeClock(at(2))
    view = cluster(clock, *round_of(0), *slow_syncing_job("n1", "n2", "n4"))

    (alert,) = judge(AlertBook(POLICY), view, clock.now())

    assert alert.rule is AlertRule.SLOW_SYNC
    assert alert.summary == (
        "job-1 syncs every ~202 steps, 2.0x the 100 it asked for: slow parameter syncs widened the interval; "
        "slowest rank 2 on n4: 60% of the gang's AllReduce time (30.0 ms); "
        "worst link n1|n4: RTT 20.0 ms (slow: RTT 20.0 ms, the cluster's 0.30 ms)"
    )


def test_slow_sync_without_measurements_says_so() -> None:
    clock = FakeClock(at(2))
    view = cluster(clock, *slow_syncing_job("n1", "n2"))

    (alert,) = judge(AlertBook(POLICY), view, clock.now())

    assert alert.summary.endswith("slowest rank 1 on n2: 75% of the gang's AllReduce time (30.0 ms); no measured link")


def test_slow_sync_names_a_link_that_is_in_line() -> None:
    clock = FakeClock(at(2))
    view = cluster(clock, *round_of(0), *slow_syncing_job("n1", "n2"))

    (alert,) = judge(AlertBook(POLICY), view, clock.now())

    assert alert.summary.endswith("; worst link n1|n2: RTT 0.3 ms")


# --- what the status API shows ------------------------------------------------------------------------------------
async def test_the_api_shows_the_live_nodes_links_worst_first_and_a_jobs_gang_links() -> None:
    clock = FakeClock(at(2))
    view = cluster(clock, *round_of(0), *slow_syncing_job("n1", "n4"))
    async with TestClient(TestServer(build_http(view, MonitorMetrics(view)))) as client:
        answer = await (await client.get("/api/links")).json()
        job = await (await client.get("/api/jobs/job-1")).json()

    assert answer["nodes"] == list(NODES) and answer["slow"] == 3
    assert [(link["a"], link["b"], link["slow"]) for link in answer["links"]] == [
        ("n1", "n4", True),
        ("n2", "n4", True),
        ("n3", "n4", True),
        ("n1", "n2", False),
        ("n1", "n3", False),
        ("n2", "n3", False),
    ]
    assert answer["links"][0] == {
        "a": "n1",
        "b": "n4",
        "rtt_ms": SLOW,
        "rtt_p90_ms": SLOW * 1.2,
        "bandwidth_bytes_per_s": 1e9,
        "source": "measured",
        "measured_at": at(0).isoformat(),
        "slow": True,
        "why": "RTT 20.0 ms, the cluster's 0.30 ms",
    }
    assert [(link["a"], link["b"], link["slow"], link["rtt_ms"]) for link in job["links"]] == [("n1", "n4", True, SLOW)]


def test_unmeasured_pairs_of_a_small_cluster_show_the_topology_estimate() -> None:
    clock = FakeClock(at(0))
    view = cluster(clock, measured("n1", "n2", 0.25, 0))

    links = view.links_json(clock.now())["links"]

    assert [(link["a"], link["b"], link["source"]) for link in links][:2] == [
        ("n1", "n2", "measured"),
        ("n1", "n3", "topology"),
    ]
    assert len(links) == 6 and links[1]["rtt_ms"] == 0.1 and links[1]["measured_at"] is None  # same rack


def test_a_gang_pair_with_an_unknown_node_has_no_figure() -> None:
    clock = FakeClock(at(2))
    view = cluster(clock, *slow_syncing_job("n1", "elsewhere"))

    (link,) = view.job_detail(view.jobs["job-1"], clock.now())["links"]

    assert (link["a"], link["b"], link["rtt_ms"], link["source"]) == ("elsewhere", "n1", None, "none")
