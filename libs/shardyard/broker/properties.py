"""The settings every Shardyard Apache Kafka runs with: one table, read by the local broker ``shardyard up`` starts
(``broker.kafka``) and by the compose cluster's (``python -m shardyard.broker.properties`` writes them for its
broker), so the tests exercise the configuration compose runs.

What differs between the two is where the broker listens and stores its log, and how it secures its listeners
(``local_properties`` for this host; compose adds its own listeners). A topic's retention and compaction are not
here: they are the topic catalogue's (``bus.topics``), set on each topic as it is created.
"""

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Setting:
    name: str
    value: str
    why: str


SHARED: Final = (
    # A single node is both KRaft controller and broker: every internal topic has one replica.
    Setting("process.roles", "broker,controller", "one node: the KRaft controller and the broker in one process"),
    Setting("node.id", "1", "the one node"),
    Setting("offsets.topic.replication.factor", "1", "one node: one replica of the committed offsets"),
    Setting("transaction.state.log.replication.factor", "1", "one node (Shardyard uses no transactions)"),
    Setting("transaction.state.log.min.isr", "1", "one node"),
    Setting("share.coordinator.state.topic.replication.factor", "1", "one node"),
    Setting("share.coordinator.state.topic.min.isr", "1", "one node"),
    Setting(
        "offsets.topic.num.partitions",
        "8",
        "a cluster has a few dozen consumer groups; 50 partitions (the default) slow the first group's start",
    ),
    # Consumer groups: Shardyard elects leaders and splits work with them, and must fail over within seconds.
    Setting(
        "group.min.session.timeout.ms",
        "1000",
        "leader elections use 2 s group sessions (bus.leadership); Kafka refuses sessions under 6 s by default",
    ),
    Setting(
        "group.initial.rebalance.delay.ms",
        "0",
        "a group's first member gets its partitions at once, not 3 s later (every service waits on it at start)",
    ),
    Setting(
        "auto.create.topics.enable",
        "false",
        "topics come from the catalogue with their partitions and retention; a misspelt one is an error, not a topic",
    ),
    # A broker that was killed registers again with its controller: until the registration of the killed process
    # lapses, the controller refuses the new one (DUPLICATE_BROKER_REGISTRATION), and the broker serves nobody.
    Setting(
        "broker.session.timeout.ms",
        "2000",
        "a killed broker's registration lapses in 2 s (default 9 s): a restarted one serves again within seconds",
    ),
    Setting("broker.heartbeat.interval.ms", "500", "the broker renews its registration within the 2 s session"),
    # Retention: per topic (the catalogue); these are the broker's floor for a topic that sets none.
    Setting(
        "log.segment.bytes",
        str(64 * 1024 * 1024),
        "retention and compaction only ever drop closed segments: small ones let a small cluster's log shrink too",
    ),
    Setting("log.retention.check.interval.ms", "60000", "old segments are deleted within a minute of expiring"),
    Setting(
        "log.cleaner.dedupe.buffer.size",
        str(16 * 1024 * 1024),
        "the compactor's index of keys: the compacted topics hold a key per node, pair of nodes or queue, not "
        "millions (Kafka's default takes 128 MiB of the heap)",
    ),
    # Threads: a small broker on few cores.
    Setting("num.network.threads", "2", "a broker on a few cores: Kafka's defaults are sized for a dedicated host"),
    Setting("num.io.threads", "4", "as above"),
    Setting("background.threads", "4", "as above"),
    Setting("num.recovery.threads.per.data.dir", "2", "log recovery after an unclean stop, in parallel"),
)


def shared_properties() -> dict[str, str]:
    return {setting.name: setting.value for setting in SHARED}


def local_properties(
    *, host: str, port: int, controller_port: int, log_dir: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The local broker's whole configuration: ``SHARED``, listening on ``host`` (clients on ``port``, the KRaft
    controller on ``controller_port``), its log in ``log_dir``; ``extra`` (the listeners' security) last."""
    return {
        **shared_properties(),
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.quorum.voters": f"1@{host}:{controller_port}",
        "log.dirs": log_dir,
        **(extra or {}),
    }


def render(properties: Mapping[str, str], *, comments: bool = True) -> str:
    """A ``server.properties`` file: each shared setting under its reason, then the rest."""
    why = {setting.name: setting.why for setting in SHARED} if comments else {}
    lines = ["# written by shardyard (shardyard.broker.properties); changes here are overwritten at each start"]
    for name, value in properties.items():
        if name in why:
            lines.append(f"# {why[name]}")
        lines.append(f"{name}={value}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """``python -m shardyard.broker.properties [FILE]``: the shared settings as ``server.properties`` (compose's
    broker starts from them and adds its listeners)."""
    text = render(shared_properties())
    if argv:
        with open(argv[0], "w") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
