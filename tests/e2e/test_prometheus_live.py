"""The shipped alert rules (``deploy/prometheus/alerts.yml``) in Debian's real Prometheus, against a live local cluster
(its default three nodes, one process per service, no jobs), scraped at the shipped interval (``prometheus.yml``:
5 s), with a scrape job for the monitor's status API (``cluster``) and one per service:

1. on the healthy cluster no rule fires, or even turns pending, for 60 s (every rule evaluated without error);
2. an agent stopped (``SIGSTOP``): Prometheus's ShardyardNodeSuspect fires within two scrape intervals of the
   monitor's own NODE_SUSPECT (``/api/alerts``); restarted (``SIGCONT``): every alert on it resolves.

The promtool tests (``alerts_test.yml``) judge the rules on series written by hand; this judges them on what the
monitor and every process export, scraped as a user's Prometheus scrapes them. The figures are printed (``-s``).

The agents do not probe their links (``SHARDYARD_PROBE_LINKS=false``): between processes on one loaded host the probes
measure CPU scheduling, not a network, and the monitor then judges loopback links slow now and then (a 4 ms RTT
against a 1 ms baseline), rightly by its rule. ShardyardSlowLink reads the monitor's verdict as it is
(``shardyard_link_slow``, no age to take), so it has no scrape-time artefact to look for here; promtool tests it, and
``test_measured_links.py`` the verdict on a network with a delay line."""

import contextlib
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardyard.broker.ports import free_port
from shardyard.cli.cluster import ClusterInfo, get_json
from tests.support import wait
from tests.support.cluster import ROOT, local_cluster, wait_for

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.broker,
    pytest.mark.skipif(
        PROMETHEUS is None, reason="Debian's `prometheus` is not installed (`./dev setup` installs it with apt-get)"
    ),
]

DEPLOY = ROOT / "deploy" / "prometheus"
SHIPPED = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())["global"]
SCRAPE_S = float(str(SHIPPED["scrape_interval"]).removesuffix("s"))
HEALTHY_S = 60.0
STOPPED = "node-0"
HEARTBEAT = "shardyard_node_last_heartbeat_timestamp_seconds"
AGES = {"time() - ts": f"time() - {HEARTBEAT}", "timestamp(ts) - ts": f"timestamp({HEARTBEAT}) - {HEARTBEAT}"}
"""A node's newest heartbeat's age, as the old rule took it (at the query) and as the rule takes it (at the scrape)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterInfo]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SHARDYARD_PROBE_LINKS": "false"}
    with local_cluster(tmp_path_factory.mktemp("prometheus-live"), replicas=1, env=env) as run_dir:
        info = ClusterInfo.load(run_dir)
        try:
            yield info
        finally:
            for pid in info.pids.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)  # nothing may stay stopped into the shutdown


def scrape_config(info: ClusterInfo) -> dict[str, Any]:
    """The shipped ``prometheus.yml`` for this cluster: its global intervals and rules, the monitor's status API as
    the ``cluster`` job, and one scrape job per service over its processes' own metrics ports."""
    monitor = urllib.parse.urlsplit(info.monitor_url).netloc
    jobs: dict[str, list[str]] = {}
    for name, port in sorted(info.metrics_ports.items()):
        service = "node-agent" if name.startswith("node-") else name.rsplit("-", 1)[0]
        jobs.setdefault(service, []).append(f"127.0.0.1:{port}")
    return {
        "global": SHIPPED,
        "rule_files": [str(DEPLOY / "alerts.yml")],
        "scrape_configs": [
            {"job_name": "cluster", "honor_labels": True, "static_configs": [{"targets": [monitor]}]},
            *({"job_name": job, "static_configs": [{"targets": targets}]} for job, targets in jobs.items()),
        ],
    }


@pytest.fixture(scope="module")
def prometheus(cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Prometheus on a free port with a TSDB of its own, scraping ``cluster``; its URL."""
    assert PROMETHEUS is not None
    folder = tmp_path_factory.mktemp("prometheus")
    config = folder / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(cluster)))
    url = f"http://127.0.0.1:{(port := free_port())}"
    argv = [
        PROMETHEUS,
        f"--config.file={config}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with (folder / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_for("Prometheus ready", lambda: _ready(url), 30, lambda: _tail(folder / "prometheus.log"))
        wait_for("Prometheus scraping every process and judging the rules", lambda: scraped(url, cluster), 60)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(url: str) -> bool:
    with contextlib.closing(urllib.request.urlopen(f"{url}/-/ready", timeout=2)) as answer:
        return bool(answer.status == 200)


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-2000:]


def api(url: str, path: str, **query: str) -> Any:
    answer = get_json(f"{url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else ""), timeout_s=5)
    assert answer["status"] == "success", answer
    return answer["data"]


def rules(url: str) -> list[dict[str, Any]]:
    return [rule for group in api(url, "rules", type="alert")["groups"] for rule in group["rules"]]


def alerts(url: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = api(url, "alerts")["alerts"]
    return found


def instant(url: str, expr: str) -> dict[str, float]:
    """``expr`` now, by node."""
    return {s["metric"].get("node", ""): float(s["value"][1]) for s in api(url, "query", query=expr)["result"]}


def scraped(url: str, info: ClusterInfo) -> bool:
    """Every target up, the monitor's heartbeat series of every node in, and the rules evaluated on them since."""
    targets = api(url, "targets", state="active")["activeTargets"]
    nodes = instant(url, HEARTBEAT)
    up = len(targets) == len(info.metrics_ports) + 1 and all(t["health"] == "up" for t in targets)
    scraped_at = max((parse_time(t["lastScrape"]) for t in targets if t["labels"]["job"] == "cluster"), default=0)
    evaluated = all(parse_time(r["lastEvaluation"]) > scraped_at for r in rules(url))
    return up and len(nodes) == sum(1 for name in info.pids if name.startswith("node-")) and evaluated


def parse_time(stamp: str) -> float:
    """Prometheus's RFC 3339 time (nanoseconds: Python keeps microseconds) as Unix seconds."""
    return datetime.fromisoformat(stamp).timestamp()


@pytest.mark.timeout(600)
def test_no_rule_fires_on_a_healthy_cluster(cluster: ClusterInfo, prometheus: str) -> None:
    seen: list[dict[str, Any]] = []
    worst = dict.fromkeys(AGES, 0.0)
    end = time.monotonic() + HEALTHY_S

    def watched() -> bool:
        """True at the end of the window, or once an alert (pending or firing) or a failing rule shows."""
        seen.extend(alerts(prometheus))
        seen.extend(r for r in rules(prometheus) if r["health"] != "ok" or r["state"] != "inactive")
        for name, expr in AGES.items():
            worst[name] = max(worst[name], *instant(prometheus, expr).values())
        return bool(seen) or time.monotonic() >= end

    wait.until(watched, f"{HEALTHY_S:g} s of the healthy cluster", HEALTHY_S + 30, every_s=1.0)
    print(f"\nhealthy {HEALTHY_S:g} s at a {SCRAPE_S:g} s scrape: newest heartbeat's age, worst seen: {worst}")

    firing = get_json(f"{cluster.monitor_url}/api/alerts")["firing"]
    assert seen == [], f"Prometheus: {seen}; the monitor fires: {firing}"


def suspect_in_monitor(info: ClusterInfo) -> dict[str, Any] | None:
    firing = get_json(f"{info.monitor_url}/api/alerts")["firing"]
    return next((a for a in firing if (a["rule"], a["subject"]) == ("NODE_SUSPECT", STOPPED)), None)


def suspect_in_prometheus(url: str) -> dict[str, Any] | None:
    return next(
        (
            a
            for a in alerts(url)
            if a["labels"]["alertname"] == "ShardyardNodeSuspect"
            and a["labels"]["node"] == STOPPED
            and a["state"] == "firing"
        ),
        None,
    )


@pytest.mark.timeout(300)
def test_node_suspect_fires_with_the_monitor(cluster: ClusterInfo, prometheus: str) -> None:
    pid = cluster.pids[STOPPED]
    stopped_at = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        monitor = wait_for(f"the monitor's NODE_SUSPECT on stopped {STOPPED}", lambda: suspect_in_monitor(cluster), 30)
        fired = wait_for(
            f"ShardyardNodeSuspect on stopped {STOPPED}", lambda: suspect_in_prometheus(prometheus), 4 * SCRAPE_S + 10
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed_at = time.time()
    by_monitor = datetime.fromisoformat(monitor["occurred_at"]).timestamp() - stopped_at
    by_prometheus = parse_time(fired["activeAt"]) - stopped_at
    print(
        f"\n{STOPPED} stopped: the monitor's NODE_SUSPECT at {by_monitor:.1f} s, Prometheus's ShardyardNodeSuspect at "
        f"{by_prometheus:.1f} s ({by_prometheus - by_monitor:.1f} s later; {SCRAPE_S:g} s scrape); resumed at "
        f"{resumed_at - stopped_at:.1f} s"
    )

    assert by_prometheus - by_monitor <= 2 * SCRAPE_S
    wait_for(
        f"every alert of {STOPPED} resolved in Prometheus",
        lambda: not any(a["labels"].get("node") == STOPPED for a in alerts(prometheus)),
        4 * SCRAPE_S + 10,
        lambda: alerts(prometheus),
    )
