"""A real test network of Linux network namespaces, with injected latency and bandwidth.

::

    with TestNetwork(nodes={"a": Link(delay_ms=0.1), "b": Link(delay_ms=10.0, rate_mbit=20)}) as net:
        server = net.run("b", [sys.executable, "-c", SERVER])
        client = net.run("a", [sys.executable, "-c", CLIENT, net.address("b")])

The layout, for a run tagged ``sy<pid>x<k>`` and the subnet ``10.S.0.0/16`` (``10.213`` unless that is taken)::

    root ns  sy<pid>x<k> 10.S.0.1 ──veth── uplink 10.S.0.2 router ns sy<pid>x<k>-r
                                            v<i> 10.S.i.1 ──veth── eth0 10.S.i.2  node ns sy<pid>x<k>-<node>
                                            t<i>  (TUN: node i's delay line)

The root namespace gets one route, ``10.S.0.0/16 via 10.S.0.2``, and nothing else changes there: its default route,
forwarding and sysctls stay as they were. Forwarding is switched on (and ``rp_filter`` off) in the router only.

**Latency.** This kernel has no ``netem``, so delay is added in user space. Each node has a TUN device in the router,
and policy routing there sends every packet from or to node ``i`` through ``t<i>`` exactly once:

* ``iif v<i> lookup T<i>``: a packet straight from node ``i`` goes to ``t<i>`` (table ``T<i>`` is ``default dev t<i>``);
* ``iif t<i> to 10.S.i.0/24 lookup main``: a packet to node ``i`` that has passed ``t<i>`` is delivered;
* ``to 10.S.i.0/24 lookup T<i>``: any other packet to node ``i`` (from the root, or out of another node's line)
  goes to ``t<i>``.

One delay-line process (this file, run as a script inside the router namespace) reads each packet from ``t<i>``,
holds it for node ``i``'s one-way delay and writes it back to ``t<i>``, where the kernel routes it on. Packets are
released at their arrival time plus the delay, in order, so a stream is pipelined rather than serialised. A packet
from node ``a`` to node ``b`` thus waits ``delay_a + delay_b``, and a TCP round trip ``2 * (delay_a + delay_b)``,
whoever opened the connection; traffic between the root and node ``i`` waits ``delay_i`` each way.

**Bandwidth.** An optional ``rate_mbit`` puts a ``tbf`` qdisc on the egress of both ends of the node's veth.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import itertools
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from types import TracebackType
from typing import Any

PREFIX = "sy"
"""The start of every namespace and root-side interface this harness makes: ``sy<pid>x<k>``."""

_TAG = re.compile(rf"^{PREFIX}(\d+)x(\d+)(?:-|$)")
_NODE_NAME = re.compile(r"^[A-Za-z0-9_]{1,32}$")
_CANDIDATE_SUBNETS = [f"10.{octet}.0.0/16" for octet in (213, *range(214, 255), *range(200, 213))]
_SETUP_TIMEOUT_S = 10.0
_runs = itertools.count()

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
PR_SET_TIMERSLACK = 29


@dataclass(frozen=True)
class Link:
    """A node's link to the router: its one-way delay (each direction) and, optionally, a bandwidth cap."""

    delay_ms: float = 0.0
    rate_mbit: float | None = None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _cmd(["ip", *args], check=check)


def _cmd(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=_SETUP_TIMEOUT_S, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@cache
def network_unavailable() -> str | None:
    """Why a :class:`TestNetwork` cannot be built here, or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (iproute2)"
    try:
        os.close(os.open("/dev/net/tun", os.O_RDWR))
    except OSError as error:
        return f"cannot open /dev/net/tun: {error}"
    probe = f"{PREFIX}{os.getpid()}x{next(_runs)}-probe"
    try:
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"cannot create a network namespace: {made.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def remove_stale() -> list[str]:
    """Delete namespaces and root-side veths left by earlier runs whose process is gone; the names removed."""
    removed: list[str] = []
    for name in _namespaces():
        found = _TAG.match(name)
        if found and not _alive(int(found.group(1))):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    for line in _ip("-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        found = _TAG.match(name)
        if found and not _alive(int(found.group(1))):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def _taken_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks the root namespace already routes or holds addresses in."""
    taken: list[ipaddress.IPv4Network] = []
    for line in _ip("-4", "-o", "route", "show", "table", "all").stdout.splitlines():
        destination = line.split()[0]
        if destination in ("default", "broadcast", "local", "unreachable", "blackhole", "prohibit"):
            destination = line.split()[1] if destination != "default" else "0.0.0.0/0"
        if destination == "0.0.0.0/0":
            continue
        with contextlib.suppress(ValueError):
            taken.append(ipaddress.IPv4Network(destination, strict=False))
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            taken.append(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).network)
    return taken


class TestNetwork:
    """Namespaces for ``nodes``, joined by a router that delays and shapes each node's link; see the module doc."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, nodes: Mapping[str, Link], *, subnet: str | None = None) -> None:
        if not nodes or len(nodes) > 250:
            raise ValueError("a TestNetwork needs between 1 and 250 nodes")
        for name in nodes:
            if not _NODE_NAME.match(name) or name == "r":
                raise ValueError(f"node name {name!r}: letters, digits and _ only, and not r (the router)")
        self.links = dict(nodes)
        self.tag = f"{PREFIX}{os.getpid()}x{next(_runs)}"
        self.router = f"{self.tag}-r"
        self.root_link = self.tag
        self._wanted_subnet = subnet
        self.subnet = ipaddress.IPv4Network(subnet or _CANDIDATE_SUBNETS[0])
        self._index = {name: i for i, name in enumerate(self.links, start=1)}
        self._made: list[str] = []
        self._root_route = False
        self._delay_line: subprocess.Popen[bytes] | None = None
        self._processes: list[subprocess.Popen[Any]] = []
        self._tun_of = {node: f"t{i}" for node, i in self._index.items()}

    # --- addresses and processes -------------------------------------------------------------------------------------

    def _host(self, third: int, fourth: int) -> str:
        return str(self.subnet.network_address + third * 256 + fourth)

    def namespace(self, node: str) -> str:
        """The name of ``node``'s namespace (for ``ip -n``)."""
        if node not in self._index:
            raise KeyError(f"no node {node!r} in this network")
        return f"{self.tag}-{node}"

    def address(self, node: str) -> str:
        """``node``'s IP address."""
        return self._host(self._index[node], 2)

    @property
    def root_address(self) -> str:
        """The root namespace's address on this network: what a broker in the root namespace listens on."""
        return self._host(0, 1)

    @property
    def delay_line_pid(self) -> int | None:
        """The pid of the delay-line process, while it runs."""
        return self._delay_line.pid if self._delay_line is not None else None

    def exec_prefix(self, node: str) -> list[str]:
        """The argv prefix that runs a command in ``node``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(node)]

    def run(self, node: str, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in ``node``'s namespace; it is killed, if still running, when the network is torn down."""
        process: subprocess.Popen[Any] = subprocess.Popen([*self.exec_prefix(node), *argv], **popen_kwargs)
        self._processes.append(process)
        return process

    # --- building and tearing down -----------------------------------------------------------------------------------

    def __enter__(self) -> TestNetwork:
        remove_stale()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def _netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _sysctl(self, namespace: str, *settings: str) -> None:
        _cmd(["ip", "netns", "exec", namespace, "sysctl", "-q", "-w", *settings])

    def _claim_subnet(self) -> None:
        """Pick a /16 the root namespace does not use yet and put the root veth in it, under a lock, so that runs
        side by side do not pick the same one."""
        lock_path = os.path.join(tempfile.gettempdir(), f"{PREFIX}-netns.lock")
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            taken = _taken_networks()
            candidates = [self._wanted_subnet] if self._wanted_subnet else _CANDIDATE_SUBNETS
            for candidate in candidates:
                assert candidate is not None
                network = ipaddress.IPv4Network(candidate)
                if network.prefixlen > 16:
                    raise ValueError(f"subnet {candidate}: needs a /16 or larger")
                if not any(network.overlaps(other) for other in taken):
                    self.subnet = network
                    break
            else:
                raise RuntimeError(f"no free subnet for a test network among {candidates}")
            _ip("link", "add", self.root_link, "type", "veth", "peer", "name", "uplink", "netns", self.router)
            _ip("addr", "add", f"{self.root_address}/24", "dev", self.root_link)
            _ip("link", "set", self.root_link, "up")

    def _build(self) -> None:
        router = self.router
        self._netns(router)
        self._sysctl(
            router,
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
            "net.ipv4.conf.all.send_redirects=0",
            "net.ipv4.conf.default.send_redirects=0",
        )
        self._claim_subnet()
        _ip("-n", router, "addr", "add", f"{self._host(0, 2)}/24", "dev", "uplink")
        _ip("-n", router, "link", "set", "uplink", "up")
        _ip("route", "add", str(self.subnet), "via", self._host(0, 2), "dev", self.root_link)
        self._root_route = True

        tuns: list[str] = []
        for node, i in self._index.items():
            link, ns, veth, tun, table = self.links[node], self.namespace(node), f"v{i}", f"t{i}", str(100 + i)
            node_net = f"{self._host(i, 0)}/24"
            self._netns(ns)
            _ip("-n", router, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", router, "addr", "add", f"{self._host(i, 1)}/24", "dev", veth)
            _ip("-n", router, "link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "route", "add", "default", "via", self._host(i, 1))
            _ip("-n", router, "tuntap", "add", "dev", tun, "mode", "tun")
            _ip("-n", router, "link", "set", tun, "up")
            _ip("-n", router, "route", "add", "default", "dev", tun, "table", table)
            _ip("-n", router, "rule", "add", "pref", str(1000 + i), "iif", veth, "lookup", table)
            _ip("-n", router, "rule", "add", "pref", str(2000 + i), "iif", tun, "to", node_net, "lookup", "main")
            _ip("-n", router, "rule", "add", "pref", str(3000 + i), "to", node_net, "lookup", table)
            tuns.append(f"{tun}={link.delay_ms / 1000.0!r}")
            if link.rate_mbit is not None:
                self._shape(router, veth, link.rate_mbit)
                self._shape(ns, "eth0", link.rate_mbit)
        self._start_delay_line(tuns)

    @staticmethod
    def _shape(namespace: str, device: str, rate_mbit: float) -> None:
        """A token bucket on ``device``'s egress: ``rate_mbit``, a burst of 4 ms of it (at least 16 KiB)."""
        burst = max(16 * 1024, int(rate_mbit * 1e6 / 8 * 0.004))
        rate = f"{int(rate_mbit * 1000)}kbit"
        tbf = ["tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]
        _cmd(["tc", "-n", namespace, "qdisc", "replace", "dev", device, "root", *tbf])

    def _start_delay_line(self, tuns: list[str]) -> None:
        argv = ["ip", "netns", "exec", self.router, sys.executable, "-I", os.path.abspath(__file__), *tuns]
        self._delay_line = process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert process.stdout is not None
        deadline = time.monotonic() + _SETUP_TIMEOUT_S
        while time.monotonic() < deadline and process.poll() is None:
            ready, _, _ = select.select([process.stdout], [], [], deadline - time.monotonic())
            if ready:
                if process.stdout.readline().strip() == b"ready":
                    return
                break
        raise RuntimeError(f"the delay line did not start (exit status {process.poll()})")

    def set_delay(self, node: str, delay_ms: float) -> None:
        """Change ``node``'s one-way delay from now on (packets already held keep theirs)."""
        line = self._delay_line
        assert line is not None and line.stdin is not None and line.stdout is not None, "the network is not up"
        line.stdin.write(f"{self._tun_of[node]} {delay_ms / 1000.0!r}\n".encode())
        line.stdin.flush()
        ready, _, _ = select.select([line.stdout], [], [], _SETUP_TIMEOUT_S)
        if not ready or line.stdout.readline().strip() != b"set":
            raise RuntimeError(f"the delay line did not take {node}'s new delay")

    def close(self) -> None:
        """Stop the processes started here and the delay line; delete the namespaces, root veth and route."""
        for process in self._processes:
            _stop(process)
        self._processes.clear()
        if self._delay_line is not None:
            if self._delay_line.stdin is not None:
                with contextlib.suppress(OSError):
                    self._delay_line.stdin.close()  # the line exits at EOF on its stdin
            _stop(self._delay_line, grace_s=2.0)
            if self._delay_line.stdout is not None:
                self._delay_line.stdout.close()
            self._delay_line = None
        if self._root_route:
            _ip("route", "del", str(self.subnet), "via", self._host(0, 2), check=False)
            self._root_route = False
        _ip("link", "del", self.root_link, check=False)
        for name in reversed(self._made):
            _ip("netns", "del", name, check=False)
        self._made.clear()


def _stop(process: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


# --- the delay line: run as a script inside the router namespace, standard library only -----------------------------


def delay_line(delays: Mapping[str, float]) -> None:
    """Hold each packet read from each TUN device for that device's delay (seconds), then write it back to it.

    Prints ``ready`` once every device is open; a line ``DEVICE SECONDS`` on its stdin sets that device's delay
    (answered ``set``: packets already held keep their time); returns when its stdin reaches EOF (the harness closed
    it or died).
    """
    queues: dict[int, deque[tuple[float, bytes]]] = {}
    delay_of: dict[int, float] = {}
    names: dict[int, str] = {}
    for name, delay in delays.items():
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
        queues[fd], delay_of[fd], names[fd] = deque(), delay, name
    _prompt()
    stdin = sys.stdin.fileno()
    watched = [stdin, *queues]
    print("ready", flush=True)
    slack = 20e-6  # a packet due this soon goes now: select() cannot wake up much more precisely
    while True:
        now = time.monotonic()
        timeout: float | None = None
        for fd, queue in queues.items():
            while queue and queue[0][0] <= now + slack:
                with contextlib.suppress(OSError):  # the kernel may refuse one (a device going away): drop it
                    os.write(fd, queue.popleft()[1])
            if queue:
                wait = queue[0][0] - now
                timeout = wait if timeout is None else min(timeout, wait)
        readable, _, _ = select.select(watched, [], [], timeout)
        now = time.monotonic()
        for fd in readable:
            if fd == stdin:
                said = os.read(stdin, 4096)
                if not said:
                    return
                for line in said.decode().splitlines():  # "DEVICE SECONDS": that device's new delay
                    name, _, seconds = line.partition(" ")
                    for tun_fd, tun_name in names.items():
                        if tun_name == name:
                            delay_of[tun_fd] = float(seconds)
                print("set", flush=True)
                continue
            queue, due = queues[fd], now + delay_of[fd]
            for _ in range(256):  # a bounded batch, so due packets of other devices are not held up
                try:
                    queue.append((due, os.read(fd, 65536)))
                except BlockingIOError:
                    break


def _prompt() -> None:
    """Wake up on time on a busy machine: no timer slack (select() would wake up to 50 us late), and a high nice."""
    with contextlib.suppress(OSError):
        os.nice(-10)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)


def _main(args: Sequence[str]) -> None:
    delays = {}
    for arg in args:
        name, _, seconds = arg.partition("=")
        delays[name] = float(seconds)
    delay_line(delays)


if __name__ == "__main__":
    _main(sys.argv[1:])
