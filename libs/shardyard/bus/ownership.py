"""Which partitions of a keyed topic a replica owns, for services whose replicas split the work by key.

Every replica follows the facts it needs in full (:mod:`shardyard.bus.follow`); a consumer group on one keyed topic
hands out that topic's partitions, and a replica acts only for the keys of its partitions. aiokafka rebalances
eagerly: the partitions held are all revoked, then the new assignment is given whole.
"""

import logging
from collections.abc import Awaitable, Callable

from aiokafka import TopicPartition
from aiokafka.abc import ConsumerRebalanceListener

from shardyard.bus.topics import Topic

log = logging.getLogger(__name__)

Assign = Callable[[frozenset[int]], Awaitable[None]]


class Ownership(ConsumerRebalanceListener):
    """Hands a replica's ``assign`` the partitions of ``topic`` it owns after each change. With ``caught_up``,
    partitions given are handed over only once it returns (the replica has read every fact written before, so it
    does not decide again what the previous owner decided). ``who`` names the replica and its work in the log line
    that records each assignment ("fault manager fm-0 decides the jobs")."""

    def __init__(
        self,
        topic: Topic,
        assign: Assign,
        owned: Callable[[], frozenset[int] | None],
        *,
        who: str,
        caught_up: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.topic = topic
        self.assign = assign
        self.owned = owned
        self.who = who
        self.caught_up = caught_up

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        taken = {tp.partition for tp in revoked if tp.topic == self.topic.name}
        await self.assign((self.owned() or frozenset()) - taken)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        given = frozenset(tp.partition for tp in assigned if tp.topic == self.topic.name)
        if self.caught_up is not None:
            await self.caught_up()
        await self.assign(given)
        log.info("%s of %s partitions %s", self.who, self.topic.name, sorted(given))
