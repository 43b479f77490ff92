"""The broker settings are one table, read by the local broker and written for compose's: each setting says why,
the local broker's file holds all of them, and the groups' timings fit the elections'."""

import pytest

from shardyard.broker.properties import SHARED, local_properties, render, shared_properties
from shardyard.bus.leadership import ElectionTimings


def test_every_shared_setting_says_why_and_is_set_once() -> None:
    names = [setting.name for setting in SHARED]
    assert len(names) == len(set(names))
    assert all(setting.why for setting in SHARED)


def test_the_local_broker_runs_every_shared_setting_and_listens_where_told() -> None:
    local = local_properties(host="127.0.0.1", port=9192, controller_port=9193, log_dir="/r/kafka/data")

    assert shared_properties().items() <= local.items()
    assert local["listeners"] == "PLAINTEXT://127.0.0.1:9192,CONTROLLER://127.0.0.1:9193"
    assert local["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9192"
    assert local["controller.quorum.voters"] == "1@127.0.0.1:9193"
    assert local["log.dirs"] == "/r/kafka/data"


def test_elections_sessions_are_allowed_by_the_broker() -> None:
    floor = int(shared_properties()["group.min.session.timeout.ms"])
    assert ElectionTimings().session_timeout_ms >= floor


def test_the_rendered_file_reads_back_as_the_same_properties() -> None:
    props = local_properties(host="h", port=1, controller_port=2, log_dir="/d", extra={"a.b": "c=d"})

    text = render(props)
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]

    assert dict(line.split("=", 1) for line in lines) == props


@pytest.mark.parametrize("setting", ["auto.create.topics.enable", "group.initial.rebalance.delay.ms"])
def test_settings_the_cluster_depends_on_are_shared(setting: str) -> None:
    assert setting in shared_properties()
