"""A broker started as a process of this host: the common start, readiness and stop of the local Apache Kafka and
the embedded broker."""

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, ClassVar, Self

from shardyard.broker.ports import free_port, wait_for_port
from shardyard.errors import BrokerStartError

START_ATTEMPTS = 3
"""How often a broker whose port was picked here is started again on fresh ports after it exited at once: another
process may take a port between ``free_port`` and the broker's bind."""


@dataclass
class BrokerProcess:
    """Start with ``start()`` (or as a context manager); ``bootstrap`` is then ``host:port``. Subclasses say how the
    broker is started (``argv``), what it needs on disk first (``prepare``) and how long a stop may take."""

    host: str = "127.0.0.1"
    port: int = 0
    log_path: Path | None = None
    startup_timeout_s: float = 60.0
    env: dict[str, str] | None = None
    """The broker's environment (None: this process's)."""
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    kind: ClassVar[str] = "broker"
    """What ``up`` calls it: ``kafka`` or ``embedded``."""
    stop_grace_s: ClassVar[float] = 10.0
    """How long a stopped broker may take to exit before it is killed (see ``stop``)."""

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def argv(self) -> list[str]:
        """The command line that starts this broker (again, on the same ports)."""
        raise NotImplementedError

    @property
    def durable(self) -> bool:
        """Whether its log outlives the process."""
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def poll(self) -> int | None:
        """The broker process's exit status once it ended (a zombie counts as ended); None while it runs or before
        it was started."""
        return self._process.poll() if self._process else None

    def pick_ports(self) -> None:
        """Pick the ports left at 0 (``port``; a subclass may have more)."""
        if self.port == 0:
            self.port = free_port(self.host)

    def forget_ports(self) -> None:
        """Let ``pick_ports`` pick again, after a start that may have lost a port to another process."""
        self.port = 0

    def prepare(self) -> None:
        """What must be on disk before the process starts (nothing here)."""

    def start(self) -> Self:
        """Start the broker and return once it listens. A broker that exits first fails at once; when its ports were
        picked here, it is first started again on fresh ones, up to ``START_ATTEMPTS`` times."""
        picked, code = self.port == 0, None
        for _attempt in range(START_ATTEMPTS if picked else 1):
            self.pick_ports()
            self.prepare()
            self._log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115 - closed in stop()
            self._process = subprocess.Popen(
                self.argv,
                stdout=self._log or subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
            if self._listening():
                return self
            code = self._process.poll()
            self.stop()
            if code is None:
                break  # it ran but did not listen in time: no port race, no retry
            if picked:
                self.forget_ports()
        raise BrokerStartError(f"the {self.kind} broker did not listen on {self.bootstrap} (exit code {code})")

    def _listening(self) -> bool:
        """Whether the broker listens within ``startup_timeout_s``; False as soon as its process has exited."""
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.poll() is not None:
                return False
            if wait_for_port(self.host, self.port, 0.2):
                return True
        return False

    def stop(self, grace_s: float | None = None) -> None:
        """Stop the broker: SIGTERM, and SIGKILL if it has not exited within ``grace_s`` (default
        ``stop_grace_s``)."""
        if self._process and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(self.stop_grace_s if grace_s is None else grace_s)
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
