"""How a process finds its broker, by the environment ``shardyard up`` gives every process it starts (standard
library only: the CLI reads it too)."""

from typing import Final

BOOTSTRAP_ENV: Final = "SHARDYARD_KAFKA_BOOTSTRAP"
"""The broker's bootstrap servers, ``host:port[,host:port]``."""
BROKER_ENV: Final = "SHARDYARD_BROKER"
"""Which broker it is: ``kafka`` (the local Apache Kafka), ``embedded`` or ``external`` (``broker.choice``; what
differs between them: ``bus.quirks``)."""
