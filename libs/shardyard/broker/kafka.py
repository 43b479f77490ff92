"""The local Apache Kafka: one KRaft node (controller and broker in one JVM), its log on disk in the run folder.

``LocalKafka.start`` writes ``server.properties`` from ``broker.properties`` (every start: ports may change), formats
the log folder the first time, starts the JVM and returns once it listens. A stopped or killed broker started again
on the same folder comes back with every topic, record and committed offset it had acknowledged (a record is
acknowledged once written to its log file: a killed JVM loses nothing the operating system holds).

Formatting runs Kafka's storage tool, a JVM of its own (about 2.5 s); a plain broker's log folder is instead copied
from one formatted once per install (``.kafka/empty-log``), which every test's broker takes.
"""

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Final

from shardyard.broker.install import KafkaInstall
from shardyard.broker.ports import free_port
from shardyard.broker.process import BrokerProcess
from shardyard.broker.properties import local_properties, render
from shardyard.errors import BrokerStartError

if TYPE_CHECKING:  # the CLI loads this module; the access table loads the event models
    from shardyard.broker.secure import Access

HEAP_ENV: Final = "SHARDYARD_KAFKA_HEAP"
JVM_OPTS_ENV: Final = "SHARDYARD_KAFKA_JVM_OPTS"
"""More options for the broker's JVM, after ours (the tests give ``-XX:TieredStopAtLevel=1``: a broker that starts
on 1.7 CPU-seconds rather than 4.6, and runs a little slower)."""
DEFAULT_HEAP: Final = "512m"
"""The broker's heap, fixed (``-Xms`` = ``-Xmx``) so its memory does not grow with uptime: at 10,000 simulated nodes
it used well under half of it."""
JVM_OPTIONS: Final = (
    # Kafka's own (bin/kafka-run-class.sh): G1 with short pauses.
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
    # A broker that runs out of memory exits (the supervisor starts it again) rather than limping on.
    "-XX:+ExitOnOutOfMemoryError",
    # The whole fixed heap resident from the start (about 0.1 s more to start): untouched, G1 touches more of it as
    # it cycles its regions, and the broker's RSS crept up for minutes (1,000 nodes: 550 to 598 MiB over 9 minutes).
    "-XX:+AlwaysPreTouch",
)
META: Final = "meta.properties"
"""What a formatted log folder holds (Kafka's storage tool writes it)."""
ARCHIVE: Final = "classes.jsa"
"""The install's class-data archive (``python -m shardyard.broker.kafka archive``, which ``./dev`` runs once per
install): the classes a broker loads at start, parsed and verified once; a broker then starts in 2.8 CPU-seconds
rather than 4.6. A Java that cannot use it (another version) ignores it."""


@dataclass
class LocalKafka(BrokerProcess):
    install: KafkaInstall | None = None
    folder: Path = field(default_factory=lambda: Path("kafka"))
    """The broker's own folder: ``server.properties`` and the log (``data/``)."""
    controller_port: int = 0
    heap: str = DEFAULT_HEAP

    kind: ClassVar[str] = "kafka"
    stop_grace_s: ClassVar[float] = 30.0
    """A broker told to stop closes its log cleanly (a few seconds); killed instead, it recovers its log at the next
    start and loses nothing it acknowledged."""

    jvm_options: tuple[str, ...] = ()
    """More options for the JVM (default: ``SHARDYARD_KAFKA_JVM_OPTS``)."""
    access: "Access | None" = None
    """TLS, SASL/SCRAM and ACLs (``broker.secure``); None: a plain broker, open to every client of this host."""

    def __post_init__(self) -> None:
        if self.install is None:
            raise BrokerStartError("no Apache Kafka install to start (see shardyard.broker.install)")
        self.folder = self.folder.resolve()
        if not self.jvm_options:
            self.jvm_options = tuple(os.environ.get(JVM_OPTS_ENV, "").split())

    @property
    def log_dir(self) -> Path:
        return self.folder / "data"

    @property
    def properties_file(self) -> Path:
        return self.folder / "server.properties"

    @property
    def durable(self) -> bool:
        return True

    @property
    def formatted(self) -> bool:
        return (self.log_dir / META).exists()

    @property
    def argv(self) -> list[str]:
        assert self.install is not None
        logging = resources.files("shardyard.broker").joinpath("log4j2.properties")
        archive = self.install.home / ARCHIVE
        return [
            self.install.java,
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            *JVM_OPTIONS,
            *(
                [f"-XX:SharedArchiveFile={archive}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
                if archive.exists()
                else []
            ),
            *self.jvm_options,
            f"-Dlog4j2.configurationFile={logging}",
            "-cp",
            self.install.classpath,
            "kafka.Kafka",
            str(self.properties_file),
        ]

    def pick_ports(self) -> None:
        super().pick_ports()
        if self.controller_port == 0:
            self.controller_port = free_port(self.host)

    def forget_ports(self) -> None:
        super().forget_ports()
        self.controller_port = 0

    def properties(self) -> dict[str, str]:
        """Its ``server.properties``: the shared settings, its ports and log, and (secured) its listeners' security."""
        secured = None
        if self.access is not None:
            from shardyard.broker.secure import listener_properties

            client = f"{self.host}:{self.port}"
            secured = listener_properties(
                self.access, clients={"CLIENTS": (client, client)}, controller=f"{self.host}:{self.controller_port}"
            )
        return local_properties(
            host=self.host,
            port=self.port,
            controller_port=self.controller_port,
            log_dir=str(self.log_dir),
            extra=secured,
        )

    def prepare(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.properties_file.write_text(render(self.properties()))
        if not self.formatted:
            self._format()

    def _format(self) -> None:
        """A new, empty log folder: a copy of the install's formatted one (made once, under a lock, as two test
        workers may both be first), else formatted here. A secured broker's is formatted here, with its principals'
        SCRAM credentials (the admin's must be there before any client can authenticate)."""
        assert self.install is not None
        if self.access is not None:
            from shardyard.broker.secure import format_args, principals_of

            self._run_format(self.log_dir, format_args(self.access, principals_of(self.access)))
            return
        template = self.install.home / "empty-log"
        try:
            with _locked(self.install.home / "empty-log.lock"):
                if not (template / META).exists():
                    self._run_format(template)
        except OSError:  # a read-only install: format in place
            self._run_format(self.log_dir)
            return
        shutil.copytree(template, self.log_dir, dirs_exist_ok=True)

    def _run_format(self, log_dir: Path, extra: list[str] | None = None) -> None:
        assert self.install is not None
        scratch = log_dir.with_name(f".{log_dir.name}.{os.getpid()}")
        shutil.rmtree(scratch, ignore_errors=True)
        config = scratch.with_suffix(".properties")
        config.write_text(render(local_properties(host=self.host, port=1, controller_port=2, log_dir=str(scratch))))
        argv = [self.install.java, "-cp", self.install.classpath, "kafka.tools.StorageTool", "format"]
        argv += ["--cluster-id", _cluster_id(), "--config", str(config), *(extra or [])]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        config.unlink(missing_ok=True)
        if done.returncode != 0:
            shutil.rmtree(scratch, ignore_errors=True)
            raise BrokerStartError(f"Kafka's storage tool could not format a log folder: {done.stdout}{done.stderr}")
        shutil.rmtree(log_dir, ignore_errors=True)
        scratch.rename(log_dir)


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (what ``kafka-storage random-uuid``
    prints), never starting with ``-``: the storage tool's argument parser takes ``--cluster-id -x...`` for an
    option and formats nothing (1 start in 64 failed so), and Kafka's own ``Uuid.randomUuid`` draws again too."""
    import base64

    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_archive(install: KafkaInstall) -> Path:
    """Start a broker that writes the install's class-data archive as it stops (``ARCHIVE``), give it the catalogue's
    topics and a consumer group's coordinator (the classes of a working cluster), and stop it."""
    import asyncio
    import tempfile

    from shardyard.bus.admin import ensure_topics

    target = install.home / ARCHIVE
    scratch = install.home / f".{ARCHIVE}.{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="shardyard-kafka-archive-") as tmp:
        broker = LocalKafka(install=install, folder=Path(tmp), jvm_options=(f"-XX:ArchiveClassesAtExit={scratch}",))
        with broker:
            asyncio.run(ensure_topics(broker.bootstrap))
    if not scratch.exists():
        raise BrokerStartError(f"the broker did not write its class-data archive ({scratch})")
    scratch.replace(target)
    return target


def main(argv: list[str]) -> int:
    """``python -m shardyard.broker.kafka archive``: write the install's class-data archive (``./dev`` does, once)."""
    from shardyard.broker.install import find_install

    if argv != ["archive"]:
        print("usage: python -m shardyard.broker.kafka archive", file=sys.stderr)
        return 2
    install, why = find_install()
    if install is None:
        print(f"no archive written: {why}", file=sys.stderr)
        return 1
    print(f"wrote {write_archive(install)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
