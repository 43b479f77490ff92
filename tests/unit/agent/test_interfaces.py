"""The interface gloo and NCCL are told to listen on: the one holding the advertised address, else the narrowest
whose subnet holds it."""

from ipaddress import IPv4Interface

import pytest

from shardyard.node_agent.environment import RunnerOptions
from shardyard.node_agent.interfaces import interface_of

HOST = {
    "lo": [IPv4Interface("127.0.0.1/8")],
    "eth0": [IPv4Interface("10.0.0.5/16")],
    "eth1": [IPv4Interface("10.0.1.9/24")],
}


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        pytest.param("10.0.0.5", "eth0", id="exact"),
        pytest.param("127.0.0.1", "lo", id="loopback"),
        pytest.param("127.0.0.2", "lo", id="in-loopback-subnet"),
        pytest.param("10.0.1.77", "eth1", id="narrowest-subnet"),
        pytest.param("192.168.1.1", None, id="no-interface"),
        pytest.param("node-a.example", None, id="not-an-address"),
        pytest.param("::1", None, id="ipv6-left-alone"),
    ],
)
def test_interface_of(address: str, expected: str | None) -> None:
    assert interface_of(address, HOST) == expected


def test_shards_are_told_the_interface() -> None:
    assert RunnerOptions(socket_ifname="eth0").net_env() == {
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_SOCKET_IFNAME": "=eth0",  # NCCL matches prefixes without the "="
    }
    assert RunnerOptions().net_env() == {}
