"""The cluster's queue configuration, as the queue and scheduler services read it from the queues file and publish
it (compacted, one record): every replica and the monitor apply the latest one."""

from typing import Final, Literal

from pydantic import Field

from shardyard.events.base import Event
from shardyard.quotas import QueuesConfig

QUEUES_KEY: Final = "queues"
"""The one key of the queues topic: compaction keeps the latest configuration."""


class QueuesConfigured(Event):
    """A queues file read and found good. ``version`` is the SHA-256 of its text: a replica that reads the same
    file publishes nothing new."""

    type: Literal["queues.configured"] = "queues.configured"
    config: QueuesConfig
    version: str = Field(pattern=r"^[0-9a-f]{64}$")
    source: str = Field(max_length=4096, description="the file it was read from, on the host of the publisher")
    published_by: str = Field(max_length=256, description="the service replica that read it")
