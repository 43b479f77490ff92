"""``shardyard up``'s options: the lowest rendezvous port it may claim for its agents (29500 by default, moved by
``SHARDYARD_RENDEZVOUS_PORT_BASE``; ``claims`` takes the first free block at or above it) and how many processes of
each service it starts (``--replicas``); a value that cannot be one is refused."""

import pytest

from shardyard.cli.claims import RENDEZVOUS_BASE
from shardyard.cli.claims import floor as rendezvous_base
from shardyard.cli.cluster import ClusterInfo, _agent_argv
from shardyard.cli.main import parser
from shardyard.cli.rundir import RUN_ID
from shardyard.errors import ClusterError


@pytest.mark.parametrize(
    ("env", "base"),
    [
        ({}, RENDEZVOUS_BASE),
        ({"SHARDYARD_RENDEZVOUS_PORT_BASE": ""}, RENDEZVOUS_BASE),
        ({"SHARDYARD_RENDEZVOUS_PORT_BASE": "20000"}, 20000),
        ({"SHARDYARD_RENDEZVOUS_PORT_BASE": " 31000 "}, 31000),
    ],
)
def test_the_base_comes_from_the_environment(env: dict[str, str], base: int) -> None:
    assert rendezvous_base(env) == base


@pytest.mark.parametrize("value", ["0", "-1", "29500x", "65000", "1e4"])
def test_a_base_that_cannot_be_one_is_refused(value: str) -> None:
    with pytest.raises(ClusterError, match="SHARDYARD_RENDEZVOUS_PORT_BASE"):
        rendezvous_base({"SHARDYARD_RENDEZVOUS_PORT_BASE": value})


def test_node_i_gets_the_50_ports_from_base_plus_50_i() -> None:
    info = ClusterInfo(run_dir="/r", bootstrap="b:1", monitor_url="", data_root="/d", broker="embedded", started_at=0)
    info.rendezvous_base = 20000
    argv = _agent_argv(2, "A100:1", info)({"metrics": 9100})
    at = argv.index("--rendezvous-port-base")
    assert argv[at + 1 : at + 4] == ["20100", "--rendezvous-port-count", "50"]


def test_each_cluster_run_gets_agents_log_folders_of_its_own() -> None:
    first, second = (
        ClusterInfo(run_dir="/r", bootstrap="b:1", monitor_url="", data_root="/d", broker="embedded", started_at=0)
        for _ in range(2)
    )
    folders = [_agent_argv(0, "A100:1", info)({"metrics": 9100}) for info in (first, second)]

    assert [argv[argv.index("--log-dir") + 1] for argv in folders] == [
        f"/r/logs/shards/{first.run_id}",
        f"/r/logs/shards/{second.run_id}",
    ]
    assert first.run_id != second.run_id and RUN_ID.fullmatch(first.run_id)


def test_up_starts_two_processes_per_service_unless_told() -> None:
    assert parser().parse_args(["up"]).replicas == 2
    assert parser().parse_args(["up", "--replicas", "1"]).replicas == 1


@pytest.mark.parametrize("value", ["0", "9", "two", "-1"])
def test_a_replica_count_that_cannot_be_one_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["up", "--replicas", value])
    assert "processes per service, 1 to 8" in capsys.readouterr().err
