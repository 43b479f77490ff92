"""Shardyard's exception tree. Foreign errors are translated at the boundary with ``raise X from exc``.

ShardyardError
├── ConfigError            settings or a command line that cannot be used
├── BrokerError            the Kafka-compatible broker cannot be started, reached or used
│   └── BrokerStartError   the embedded broker did not become ready
├── EventDecodeError       bytes on a topic that are not a valid event of that topic
├── ClusterError           a local cluster (``shardyard up``) is missing, half-started or unhealthy
└── JobPathError           a job path a node will not map to its disk: not absolute, not normalised, not mounted
"""


class ShardyardError(Exception):
    """Base of every error Shardyard raises on purpose."""


class ConfigError(ShardyardError):
    """Settings or arguments that cannot be used."""


class BrokerError(ShardyardError):
    """The broker cannot be started, reached or used."""


class BrokerStartError(BrokerError):
    """The embedded broker process did not become ready."""


class EventDecodeError(ShardyardError):
    """A message that does not decode into an event of its topic."""


class ClusterError(ShardyardError):
    """A local cluster is missing, half-started or unhealthy."""


class JobPathError(ShardyardError):
    """A path a job names that this node does not serve: it is never looked at or opened here."""
