"""The namespace test network itself: its delay lines give the round trips asked for, in both directions and
whoever opens the connection; the root namespace reaches the nodes; a rate cap holds; nothing is left behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import wait
from tests.support.netns import Link, TestNetwork, network_unavailable, remove_stale

pytestmark = pytest.mark.skipif(network_unavailable() is not None, reason=f"{network_unavailable()}")

ECHO_PORT = 7000
SINK_PORT = 7001
RATE_MBIT = 20.0
BULK_BYTES = 4 * 1024 * 1024

ECHO_SERVER = f"""
import socket, threading
server = socket.create_server(("0.0.0.0", {ECHO_PORT}), reuse_port=True)
def echo(conn):
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)
while True:
    threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
"""

RTT_CLIENT = """
import json, socket, statistics, sys, time
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(23):
    start = time.perf_counter()
    conn.sendall(b"x" * 32)
    got = 0
    while got < 32:
        got += len(conn.recv(64))
    rtts.append((time.perf_counter() - start) * 1000)
print(json.dumps({"median_ms": statistics.median(rtts[3:]), "rtts_ms": rtts[3:]}))
"""

SINK_SERVER = f"""
import json, socket, time
server = socket.create_server(("0.0.0.0", {SINK_PORT}))
while True:
    conn = server.accept()[0]
    first = conn.recv(65536)
    if not first:
        continue  # a readiness probe
    start, total = time.perf_counter(), 0
    while data := conn.recv(65536):
        total += len(data)
    elapsed = time.perf_counter() - start
    print(json.dumps({{"bytes": total, "seconds": elapsed, "mbit_s": total * 8 / elapsed / 1e6}}), flush=True)
    break
"""

BULK_SENDER = """
import socket, sys
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
conn.sendall(b"\\0" * int(sys.argv[3]))
conn.close()
"""

GREETED_CLIENT = """
import socket, sys
print(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10).recv(64).decode())
"""


def _connects(address: str, port: int) -> bool:
    with socket.create_connection((address, port), timeout=1):
        return True


def _output(process: subprocess.Popen[str], timeout_s: float) -> str:
    """What ``process`` printed, once it has ended within ``timeout_s``."""
    out, err = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, f"exit status {process.returncode}: {err}"
    return out


@pytest.fixture(scope="module")
def net() -> Iterator[TestNetwork]:
    nodes = {"a": Link(delay_ms=0.1), "b": Link(delay_ms=10.0), "c": Link(delay_ms=0.1)}
    with TestNetwork(nodes={**nodes, "d": Link(delay_ms=0.1, rate_mbit=RATE_MBIT)}) as network:
        yield network


@pytest.fixture(scope="module")
def echo_servers(net: TestNetwork) -> TestNetwork:
    for node in ("a", "b", "c"):
        net.run(node, [sys.executable, "-c", ECHO_SERVER])
        address = net.address(node)
        wait.until(lambda: _connects(address, ECHO_PORT), f"echo server in {node}", 10, tolerate=(OSError,))  # noqa: B023
    return net


def _least_rtt_ms(net: TestNetwork, client: str, server: str) -> float:
    """The least of 20 round trips from ``client`` to ``server``: the delays injected are a floor no round trip goes
    under, and a loaded machine only adds to some of them (the median measured 48 ms for 20.2 injected, once)."""
    argv = [sys.executable, "-c", RTT_CLIENT, net.address(server), str(ECHO_PORT)]
    measured: dict[str, Any] = json.loads(_output(net.run(client, argv, stdout=subprocess.PIPE, text=True), 20))
    rtts = [float(r) for r in measured["rtts_ms"]]
    shown = [round(r, 2) for r in rtts]
    print(f"{client}->{server}: least {min(rtts):.2f}, median {measured['median_ms']:.2f} ms of {shown}")
    return min(rtts)


def test_round_trips_add_both_ends_delays_in_both_directions(echo_servers: TestNetwork) -> None:
    net = echo_servers
    expected_ms = 2 * (0.1 + 10.0)  # each way: a's 0.1 ms and b's 10 ms; one direction alone would be half
    for client, server in (("a", "b"), ("c", "b"), ("b", "a")):  # b -> a: a connection opened from b
        assert 0.8 * expected_ms <= _least_rtt_ms(net, client, server) <= 1.5 * expected_ms, (client, server)
    assert _least_rtt_ms(net, "a", "c") < 2.0


def test_the_root_namespace_and_the_nodes_reach_each_other(net: TestNetwork) -> None:
    seen: list[str] = []
    with socket.create_server((net.root_address, 0)) as server:
        server.settimeout(15)

        def greet() -> None:
            conn, (peer, _) = server.accept()
            with conn:
                seen.append(peer)
                conn.sendall(b"hello from the root namespace")

        greeter = threading.Thread(target=greet, daemon=True)
        greeter.start()
        argv = [sys.executable, "-c", GREETED_CLIENT, net.root_address, str(server.getsockname()[1])]
        assert _output(net.run("a", argv, stdout=subprocess.PIPE, text=True), 15).strip() == (
            "hello from the root namespace"
        )
        greeter.join(5)
    assert seen == [net.address("a")], "the root saw the node's own address: routed, not translated"


def test_a_rate_cap_holds_a_bulk_transfer_to_it(net: TestNetwork) -> None:
    sink = net.run("d", [sys.executable, "-c", SINK_SERVER], stdout=subprocess.PIPE, text=True)
    wait.until(lambda: _connects(net.address("d"), SINK_PORT), "the sink in d", 10, tolerate=(OSError,))
    sender = net.run("a", [sys.executable, "-c", BULK_SENDER, net.address("d"), str(SINK_PORT), str(BULK_BYTES)])
    measured = json.loads(_output(sink, 20))
    assert sender.wait(10) == 0
    print(f"a->d: {measured['bytes']} bytes in {measured['seconds']:.2f} s = {measured['mbit_s']:.2f} Mbit/s")
    assert measured["mbit_s"] == pytest.approx(RATE_MBIT, rel=0.25)


def _leftovers(net: TestNetwork) -> list[str]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout
    return [
        *(f"namespace {line}" for line in namespaces.splitlines() if line.startswith(net.tag)),
        *(
            f"link {line}"
            for line in links.splitlines()
            if f" {net.root_link}@" in line or f" {net.root_link}:" in line
        ),
        *(f"route {line}" for line in routes.splitlines() if line.startswith(str(net.subnet))),
    ]


def test_nothing_is_left_behind_even_after_an_error() -> None:
    with pytest.raises(RuntimeError, match="boom"), TestNetwork(nodes={"x": Link(delay_ms=1.0, rate_mbit=50)}) as net:
        assert _leftovers(net), "the network was built"
        delay_line = net.delay_line_pid
        sleeper = net.run("x", [sys.executable, "-c", "import time; time.sleep(300)"])
        raise RuntimeError("boom")
    assert _leftovers(net) == []
    assert sleeper.poll() is not None, "processes started in a node are stopped"
    assert delay_line is not None
    with pytest.raises(ProcessLookupError):
        os.kill(delay_line, 0)


def test_stale_namespaces_of_dead_runs_are_removed() -> None:
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    stale = f"sy{gone.pid}x0-r"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        assert stale in remove_stale()
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True, check=False)
    assert stale not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
