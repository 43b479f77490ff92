"""The link probe: a small TCP endpoint every node agent runs, and the client side that measures a link with it.

The protocol, over one TCP connection that may carry many requests:

- ping: the client sends ``b"P"`` and 8 bytes (a sequence number); the endpoint sends the same 9 bytes back. The
  round trip is the time from the send to the echo's arrival (``TCP_NODELAY`` on both ends, so no Nagle delay);
- burst: the client sends ``b"B"``, a 4-byte big-endian length n (at most ``MAX_BURST_BYTES``) and n bytes; the
  endpoint answers ``b"A"`` once it has read them all. The throughput is n over the time from the first byte sent to
  the answer, less one round trip (the answer's way back).

Anything else closes the connection; so does a connection idle for ``IDLE_TIMEOUT_S``. Where to probe, and how
often, is the agent's (``shardyard.node_agent.links``); what the figures mean for placement and alerts is
``shardyard.links``'."""

import asyncio
import contextlib
import socket
import statistics
import struct
import time
from dataclasses import dataclass

PING = b"P"
BURST = b"B"
ACK = b"A"
MAX_BURST_BYTES = 64 * 1024 * 1024
IDLE_TIMEOUT_S = 30.0
CHUNK = 256 * 1024
_PAYLOAD = bytes(CHUNK)


@dataclass(frozen=True)
class RoundTrips:
    """The round trips of one probe round, in milliseconds."""

    samples_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def p90_ms(self) -> float:
        ordered = sorted(self.samples_ms)
        return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def bind_endpoint(host: str, port: int) -> socket.socket:
    """A listening socket for the probe endpoint: on ``port``, or on a free one when another process holds it (two
    local clusters on one host, both on the default rendezvous ports): the node advertises the port it got, and a
    clash costs nothing but a warning in the agent's log."""
    for wanted in (port, 0):
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, wanted))
        except OSError:
            sock.close()
            if wanted == 0:
                raise
            continue
        sock.listen(64)
        sock.setblocking(False)
        return sock
    raise AssertionError("unreachable")


class ProbeServer:
    """The endpoint peers probe this node at: started with ``start()``, stopped with ``stop()``; on ``sock`` when
    given (``bind_endpoint``), else bound to ``host:port`` at start."""

    def __init__(self, host: str, port: int, sock: socket.socket | None = None) -> None:
        self.host = host
        self.port = port if sock is None else sock.getsockname()[1]
        self.requests = 0
        self.bytes_in = 0
        self._sock = sock
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        if self._sock is not None:
            self._server = await asyncio.start_server(self._serve, sock=self._sock)
        else:
            self._server = await asyncio.start_server(self._serve, self.host, self.port, reuse_address=True)
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _no_delay(writer)
        try:
            while True:
                op = await asyncio.wait_for(reader.readexactly(1), IDLE_TIMEOUT_S)
                if op == PING:
                    seq = await asyncio.wait_for(reader.readexactly(8), IDLE_TIMEOUT_S)
                    writer.write(op + seq)
                    self.bytes_in += 9
                elif op == BURST:
                    (size,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), IDLE_TIMEOUT_S))
                    if size > MAX_BURST_BYTES:
                        return
                    await _drain_bytes(reader, size)
                    writer.write(ACK)
                    self.bytes_in += 5 + size
                else:
                    return  # not the protocol: close
                self.requests += 1
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _drain_bytes(reader: asyncio.StreamReader, size: int) -> None:
    left = size
    while left > 0:
        chunk = await asyncio.wait_for(reader.read(min(left, CHUNK)), IDLE_TIMEOUT_S)
        if not chunk:
            raise asyncio.IncompleteReadError(b"", left)
        left -= len(chunk)


def _no_delay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@dataclass
class ProbeClient:
    """One connection to a peer's probe endpoint. Use as ``async with ProbeClient(host, port, timeout_s) as c:``."""

    host: str
    port: int
    timeout_s: float = 2.0
    delay_s: float = 0.0
    """Added to each ping's round trip: a test's slow network (``shardyard.training.slowdown.LinkDelay``), else 0."""
    bytes_out: int = 0
    _reader: asyncio.StreamReader | None = None
    _writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> "ProbeClient":
        reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), self.timeout_s)
        _no_delay(writer)
        self._reader, self._writer = reader, writer
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._writer.wait_closed(), self.timeout_s)

    async def round_trips(self, count: int, warmup: int = 1) -> RoundTrips:
        """``count`` pings, one at a time, after ``warmup`` that are not counted (the first pays for the slow start
        of a fresh connection)."""
        samples = []
        for seq in range(warmup + count):
            took = await self._ping(seq)
            if seq >= warmup:
                samples.append(took * 1000.0)
        return RoundTrips(tuple(samples))

    async def burst(self, size: int, rtt_ms: float) -> float:
        """Send ``size`` bytes and wait for the endpoint's answer: the throughput in bytes a second, the answer's
        way back (``rtt_ms``, half of it each way: the first byte's way there and the answer's way back) taken off."""
        reader, writer = self._open()
        start = time.perf_counter()
        writer.write(BURST + struct.pack(">I", size))
        left = size
        while left > 0:
            piece = min(left, CHUNK)
            writer.write(_PAYLOAD[:piece])
            left -= piece
            await asyncio.wait_for(writer.drain(), self.timeout_s)
        answer = await asyncio.wait_for(reader.readexactly(1), self.timeout_s)
        took = time.perf_counter() - start
        self.bytes_out += 5 + size
        if answer != ACK:
            raise ConnectionError(f"probe endpoint {self.host}:{self.port} answered {answer!r} to a burst")
        return size / max(took - rtt_ms / 1000.0, took / 100.0)

    async def _ping(self, seq: int) -> float:
        reader, writer = self._open()
        frame = PING + struct.pack(">Q", seq)
        start = time.perf_counter()
        writer.write(frame)
        await asyncio.wait_for(writer.drain(), self.timeout_s)
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)  # the test hook's slower round trip (0 in any real run)
        echo = await asyncio.wait_for(reader.readexactly(9), self.timeout_s)
        took = time.perf_counter() - start
        self.bytes_out += 9
        if echo != frame:
            raise ConnectionError(f"probe endpoint {self.host}:{self.port} echoed {echo!r}, not {frame!r}")
        return took

    def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            raise RuntimeError("ProbeClient used outside `async with`")
        return self._reader, self._writer
