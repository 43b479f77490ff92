"""The Prometheus twins of the monitor's alert rules (``deploy/prometheus/alerts.yml``) are valid, behave as their
tests say (``alerts_test.yml``), name only metrics the monitor exports, and cover every rule of the monitor."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from shardyard.events import AlertRule, NodeStatus
from shardyard.monitor.metrics import make_registry
from shardyard.monitor.views import ClusterView
from tests.unit.builders import node_state

RULES_DIR = Path(__file__).resolve().parents[3] / "deploy" / "prometheus"
RULES = RULES_DIR / "alerts.yml"
RULE_TESTS = RULES_DIR / "alerts_test.yml"


def promtool() -> str:
    """promtool's path. Missing, the test fails rather than skips: a skipped check would pass CI unseen."""
    found = shutil.which("promtool")
    if found is None:
        pytest.fail(
            "promtool is not on PATH. Install the Debian package `prometheus` "
            "(`./dev test` does when apt-get is available)."
        )
    return found


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *argv], cwd=RULES_DIR, capture_output=True, text=True, timeout=60, check=False)


def test_rules_are_valid() -> None:
    checked = run("check", "rules", RULES.name)

    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_rules_pass_their_tests() -> None:
    tested = run("test", "rules", RULE_TESTS.name)

    assert tested.returncode == 0, tested.stdout + tested.stderr


def rules() -> list[dict[str, object]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_every_monitor_rule_has_a_prometheus_twin() -> None:
    assert sorted(str(rule["labels"]["rule"]) for rule in rules()) == sorted(AlertRule)  # type: ignore[index]


def test_rules_name_only_metrics_the_monitor_exports() -> None:
    view = ClusterView()
    view.apply(node_state(status=NodeStatus.SUSPECT))
    view.consumer_lag = {"shardyard.alerts": 0}
    exported = {
        line.split()[2]
        for line in generate_latest(make_registry(view)[0]).decode().splitlines()
        if line.startswith("# TYPE")
    }
    named = {name for rule in rules() for name in re.findall(r"\bshardyard_[a-z_]+", str(rule["expr"]))}

    assert named <= exported, f"not exported by the monitor: {sorted(named - exported)}"
