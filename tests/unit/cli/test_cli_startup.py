"""What ``shardyard up`` does while its processes start, with real (tiny) child processes and no broker: a child
that dies fails the wait at once, named with its exit status and log; one that lost a race for its port is started
again on a fresh one and the cluster file says so."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from shardyard.broker.embedded import EmbeddedBroker
from shardyard.broker.ports import free_port
from shardyard.broker.process import BrokerProcess
from shardyard.cli.children import PORT_RETRIES, Child, Children, Ports, alive, wait_ready
from shardyard.cli.cluster import ClusterInfo, _record
from shardyard.errors import BrokerStartError, ClusterError
from tests.support import wait

SERVE = (
    "import socket, sys, time\n"
    "s = socket.socket()\n"
    "s.bind(('127.0.0.1', int(sys.argv[1])))\n"  # raises OSError: [Errno 98] Address already in use when taken
    "s.listen()\n"
    "time.sleep(60)\n"
)


def serves(ports: Ports) -> list[str]:
    """A child that listens on its ``metrics`` port, like a service's metrics server."""
    return [sys.executable, "-c", SERVE, str(ports["metrics"])]


def script(code: str) -> Callable[[Ports], list[str]]:
    return lambda _ports: [sys.executable, "-c", code]


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture
def taken() -> Iterator[list[int]]:
    """Ports held (bound, not listening) by this test: a child that binds one loses the race for it."""
    held = []
    for _ in range(PORT_RETRIES + 1):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        held.append(sock)
    yield [sock.getsockname()[1] for sock in held]
    for sock in held:
        sock.close()


def picker(first: Mapping[tuple[str, str], list[int]]) -> Callable[[str, str], int]:
    """The given ports for (name, role) first, one per pick; then free ones."""
    queues = {key: list(ports) for key, ports in first.items()}

    def pick(name: str, role: str) -> int:
        queue = queues.get((name, role))
        if queue:
            return queue.pop(0)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    return pick


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Children]:
    made = Children(tmp_path, dict(os.environ))
    yield made
    for child in made.started.values():
        if child.process.poll() is None:
            child.process.kill()
            child.process.wait(5)


def test_a_child_that_dies_at_start_up_fails_the_wait_at_once_naming_it(children: Children) -> None:
    children.start("serving", serves, ("metrics",))
    children.start("node-0", script("import sys; print('error: invalid settings: lease_s'); sys.exit(2)"), ("metrics",))
    began = time.monotonic()

    with pytest.raises(ClusterError) as failed:
        wait_ready(children, ready=lambda: False, timeout_s=60, say=lambda _m: None)

    elapsed = time.monotonic() - began
    assert elapsed < 5.0, f"{elapsed:.1f} s against a 60 s timeout"
    message = str(failed.value)
    assert message.startswith("node-0 exited during start-up (exit code 2)")
    assert "error: invalid settings: lease_s" in message
    assert children.started["serving"].process.poll() is None  # the others are the caller's to stop


def test_a_killed_child_is_dead_though_not_reaped(children: Children) -> None:
    child = children.start("victim", script("import time; time.sleep(60)"), ("metrics",))
    os.kill(child.process.pid, signal.SIGKILL)
    wait.until(
        lambda: Path(f"/proc/{child.process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z",
        "the child to become a zombie",
        5.0,
        every_s=0.01,
    )

    os.kill(child.process.pid, 0)  # a zombie answers as if it lived: what `up` used to ask
    assert not alive(child.process.pid)
    with pytest.raises(ClusterError, match=r"victim exited during start-up \(killed by signal 9\)"):
        wait_ready(children, ready=lambda: False, timeout_s=60, say=lambda _m: None)


def test_a_child_that_lost_a_port_race_is_started_again_on_a_fresh_port(tmp_path: Path, taken: list[int]) -> None:
    info = ClusterInfo(str(tmp_path), "b:1", "", str(tmp_path), True, 0.0)
    said: list[str] = []
    children = Children(
        tmp_path,
        dict(os.environ),
        picker({("monitor-0", "http"): taken[:1], ("queue-0", "metrics"): taken[1:2]}),
        on_change=lambda started: _record(info, started),
    )
    try:
        children.start("queue-0", serves, ("metrics",))
        monitor = children.start(
            "monitor-0", lambda ports: [sys.executable, "-c", SERVE, str(ports["http"])], ("http", "metrics")
        )
        assert (info.metrics_ports["queue-0"], info.monitor_url) == (taken[1], f"http://127.0.0.1:{taken[0]}")

        def ready() -> bool:
            return all(listening(next(iter(c.ports.values()))) for c in children.started.values())

        wait_ready(children, ready=ready, timeout_s=30, say=said.append)

        again = children.started["monitor-0"]
        assert again.restarts == 1 and again.process.pid != monitor.process.pid
        assert children.started["queue-0"].restarts == 1
        saved = ClusterInfo.load(tmp_path)
        assert saved.monitor_url == f"http://127.0.0.1:{again.ports['http']}" != f"http://127.0.0.1:{taken[0]}"
        assert saved.metrics_ports["queue-0"] == children.started["queue-0"].ports["metrics"] != taken[1]
        assert saved.pids["monitor-0"] == again.process.pid
        assert sorted(m.split()[0] for m in said) == ["monitor-0", "queue-0"]
        assert all("lost a race for a port" in m for m in said)
        assert (tmp_path / "monitor-0.log").read_text().lower().count("address already in use") >= 1
    finally:
        for child in children.started.values():
            child.process.kill()
            child.process.wait(5)


def test_port_retries_are_bounded(children: Children, taken: list[int]) -> None:
    children.pick_port = picker({("queue-0", "metrics"): taken})
    children.start("queue-0", serves, ("metrics",))

    with pytest.raises(ClusterError, match=r"(?is)queue-0 exited during start-up .*address already in use"):
        wait_ready(children, ready=lambda: False, timeout_s=60, say=lambda _m: None)

    assert children.started["queue-0"].restarts == PORT_RETRIES


def test_an_earlier_runs_port_race_in_the_same_log_is_not_this_ones(children: Children) -> None:
    (children.logs / "queue-0.log").write_text("OSError: [Errno 98] Address already in use\n")
    children.start("queue-0", script("import sys; print('no such option'); sys.exit(2)"), ("metrics",))

    with pytest.raises(ClusterError, match="exit code 2") as failed:
        wait_ready(children, ready=lambda: False, timeout_s=60, say=lambda _m: None)

    assert children.started["queue-0"].restarts == 0
    assert "Address already in use" not in str(failed.value)


def test_a_process_that_cannot_be_restarted_fails_the_wait_named(children: Children) -> None:
    (children.logs / "broker.log").write_text("panicked: Address in use\n")
    children.start("queue-0", serves, ("metrics",))

    with pytest.raises(ClusterError, match=r"broker exited during start-up \(exit code 101\)(.|\n)*panicked"):
        wait_ready(children, ready=lambda: False, timeout_s=60, others={"broker": lambda: 101}, say=lambda _m: None)


def test_the_wait_ends_at_its_timeout_when_nothing_died(children: Children) -> None:
    children.start("queue-0", serves, ("metrics",))

    with pytest.raises(ClusterError, match="not ready within"):
        wait_ready(children, ready=lambda: False, timeout_s=0.3, say=lambda _m: None)


def test_the_wait_returns_once_ready(children: Children) -> None:
    child: Child = children.start("queue-0", serves, ("metrics",))
    deadline = time.monotonic() + 10

    wait_ready(children, ready=lambda: listening(child.ports["metrics"]), timeout_s=10, say=lambda _m: None)

    assert time.monotonic() < deadline


def local_kafka(log: Path, port: int = 0) -> BrokerProcess:
    from shardyard.broker.install import find_install
    from shardyard.broker.kafka import LocalKafka

    install, why = find_install()
    if install is None:
        pytest.fail(why)
    return LocalKafka(install=install, folder=log.parent / "kafka", log_path=log, port=port)


BROKERS = {
    "embedded": lambda log, port=0: EmbeddedBroker(log_path=log, port=port, startup_timeout_s=15),
    "kafka": local_kafka,
}


@pytest.mark.broker
@pytest.mark.parametrize("kind", BROKERS)
def test_a_broker_that_lost_its_port_starts_again_on_another(
    tmp_path: Path, taken: list[int], monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    import shardyard.broker.process

    picks = [taken[0]]
    monkeypatch.setattr(shardyard.broker.process, "free_port", lambda host: picks.pop(0) if picks else free_port(host))
    log = tmp_path / "broker.log"

    with BROKERS[kind](log) as broker:
        assert broker.port != taken[0] and broker.poll() is None
        assert listening(broker.port)
    assert "in use" in log.read_text()  # the first start's: "Address in use" (Tansu), "Address already in use"


@pytest.mark.broker
@pytest.mark.parametrize("kind", BROKERS)
def test_a_broker_on_a_taken_fixed_port_fails_at_once(tmp_path: Path, taken: list[int], kind: str) -> None:
    began = time.monotonic()
    with pytest.raises(BrokerStartError, match="did not listen"):
        BROKERS[kind](tmp_path / "broker.log", taken[0]).start()
    # It exited: no wait for the start-up timeout (a JVM takes its seconds to start and fail).
    assert time.monotonic() - began < {"embedded": 5.0, "kafka": 15.0}[kind]
