"""Leader election through Kafka, for services that run as several replicas with one leader.

Every replica of a service joins the consumer group ``shardyard-<service>-leader`` on the one-partition topic
``shardyard.leadership``: the group coordinator gives that partition to exactly one live member, and that member
leads. On getting it, the replica writes a ``LeadershipClaimed`` record; the record's offset plus one is its **term**,
unique and higher than every earlier claim's (the broker orders the claims), so whatever a leader sends carries a term
that receivers can use to refuse an older leader's orders.

A leader proves it still holds the partition with a **lease**: an offset commit succeeds only for a current member of
the group's current generation (a member that was paused or cut off gets ``CommitFailedError``). The lease lasts
``lease_s`` from the moment such a commit was sent, and is kept shorter than the time in which the group could give the
partition to another member (the rebalance and session timeouts), so a leader that was stopped (``SIGSTOP``, a long
GC pause, a lost network) finds its lease expired when it resumes and does not act before it has re-proved membership.
``confirm(term)`` is that check: a service calls it before publishing decisions made under ``term``. A renewal
that came back after the lease it was to extend had run out proves nothing about the time since (the group may have
moved the partition meanwhile): it ends the leadership like a failed one.

A replica that still holds the partition but lost its leadership without a rebalance (a claim it could not write, a
lease renewal that failed or came back late: a slow or busy broker) claims again, under a new term, every
``reclaim_after_s`` until it leads or the group gives the partition to another member. Nothing else would: the group
rebalances only when its membership changes, so without that the service would have no leader at all.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from shardyard.bus.codec import encode
from shardyard.bus.quirks import fetch_wait_ms
from shardyard.bus.seal import for_component
from shardyard.bus.topics import LEADERSHIP, SERVICES
from shardyard.bus.transport import client_options
from shardyard.clock import Clock
from shardyard.events import LeaderElected, LeadershipClaimed

log = logging.getLogger(__name__)

PARTITION = TopicPartition(LEADERSHIP.name, 0)


@dataclass(frozen=True)
class ElectionTimings:
    """A killed leader is replaced after about ``session_timeout_ms`` plus one rebalance (``rebalance_timeout_ms``
    on the embedded broker). Apache Kafka refuses sessions shorter than its ``group.min.session.timeout.ms``
    (6 s by default): the compose cluster lowers it."""

    session_timeout_ms: int = 2000
    heartbeat_interval_ms: int = 250
    rebalance_timeout_ms: int = 1000
    lease_s: float = 0.75
    renew_interval_s: float = 0.2
    reclaim_after_s: float = 1.0
    """How long a replica that holds the partition without leading waits before it claims again."""

    def __post_init__(self) -> None:
        bound = min(self.session_timeout_ms - self.heartbeat_interval_ms, self.rebalance_timeout_ms) / 1000
        if not 0 < self.lease_s < bound:
            raise ValueError(f"lease_s must be below {bound:.2f} s, before the group could elect another leader")

    def group_options(self) -> dict[str, int]:
        """These timings for a consumer group whose partitions move between replicas within an election's time."""
        return {
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "rebalance_timeout_ms": self.rebalance_timeout_ms,
        }


def group_of(service: str) -> str:
    return f"shardyard-{service}-leader"


def _held_term(metadata: ConsumerProtocolMemberMetadata) -> int:
    try:
        return int(metadata.user_data or b"0")
    except ValueError:
        return 0


def sticky_assignor(held_term: Callable[[], int]) -> type[AbstractPartitionAssignor]:
    """An assignor that leaves the partition with the member that led last, so a replica (re)joining the group does
    not move the leadership (the default assignors give it to the first member id in sort order). Each member puts
    the term it last led under in its join metadata (0: none); the group's assigning member gives the partition to
    the highest, so a replica that resumes after a pause, still believing it leads, does not win it back."""

    class StickyLeader(AbstractPartitionAssignor):
        name = "shardyard-sticky-leader"
        version = 0

        @classmethod
        def assign(
            cls, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
        ) -> dict[str, ConsumerProtocolMemberAssignment]:
            chosen = max(sorted(members), key=lambda member: _held_term(members[member]))
            return {
                member: ConsumerProtocolMemberAssignment(
                    cls.version, [(PARTITION.topic, [PARTITION.partition])] if member == chosen else [], b""
                )
                for member in members
            }

        @classmethod
        def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
            return ConsumerProtocolMemberMetadata(cls.version, list(topics), str(held_term()).encode())

        @classmethod
        def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
            pass

    return StickyLeader


class Leadership:
    """One replica's part in its service's election. ``on_elected(term)`` is called when it becomes leader,
    ``on_lost()`` when it stops being leader (a rebalance, which may hand the partition straight back, or a lease it
    could not renew). Both are plain callbacks: start work from them, do not block in them."""

    def __init__(
        self,
        bootstrap: str,
        *,
        service: str,
        instance: str,
        clock: Clock,
        on_elected: Callable[[int], None],
        on_lost: Callable[[], None],
        timings: ElectionTimings = ElectionTimings(),
    ) -> None:
        self.bootstrap = bootstrap
        self.service = service
        self.instance = instance
        self.clock = clock
        self.timings = timings
        self._on_elected = on_elected
        self._on_lost = on_lost
        self.term: int | None = None
        """The term this replica leads under; None while it does not lead."""
        self._claimed = -1
        self._held_term = 0
        """The term of this replica's last leadership, until an assignment gives the partition to another member or
        a lease renewal fails (a revocation alone does not clear it: the partition may come straight back)."""
        self._announced = False
        self._lease_until = 0.0
        self._holds_partition = False
        """The group's last assignment gave this replica the partition (whether or not it leads under a term)."""
        self._claim_after = 0.0
        """Monotonic time before which a replica holding the partition without a term does not claim again."""
        self._renewing = asyncio.Lock()
        self._claiming = asyncio.Lock()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task[None] | None = None
        self._seal = for_component(self.service, self.instance)
        """Seals the claims and announcements (``shardyard.bus.seal``); None without a cluster secret."""

    @property
    def leading(self) -> bool:
        return self.term is not None

    async def start(self) -> None:
        t = self.timings
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=f"{self.service}-{self.instance}-election",
            enable_idempotence=False,
            acks="all",
            **client_options(),
        )
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            fetch_max_wait_ms=fetch_wait_ms(),
            bootstrap_servers=self.bootstrap,
            client_id=f"{self.service}-{self.instance}-election",
            group_id=group_of(self.service),
            enable_auto_commit=False,
            auto_offset_reset="latest",
            session_timeout_ms=t.session_timeout_ms,
            heartbeat_interval_ms=t.heartbeat_interval_ms,
            rebalance_timeout_ms=t.rebalance_timeout_ms,
            partition_assignment_strategy=(sticky_assignor(lambda: self._held_term),),
            **client_options(),
        )
        await self._consumer.start()
        self._consumer.subscribe([LEADERSHIP.name], listener=_Listener(self))
        self._task = asyncio.create_task(self._run(), name=f"{self.service}-election")

    async def stop(self) -> None:
        """Leave the group (the next replica is elected at once, not after the session timeout)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._lose()
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()

    async def confirm(self, term: int | None = None) -> bool:
        """Whether this replica leads now (under ``term``, when given): its lease holds, or a fresh commit proves it
        still holds the partition. Decisions made under an earlier term of this replica are not confirmed."""
        if self.term is None or (term is not None and term != self.term):
            return False
        if time.monotonic() < self._lease_until:
            return True
        return await self._renew()

    # --- the group's callbacks -------------------------------------------------------------------------------
    async def _assigned(self, assigned: set[TopicPartition]) -> None:
        self._holds_partition = PARTITION in assigned
        if not self._holds_partition:
            self._held_term = 0
            return
        await self._claim()

    async def _claim(self) -> None:
        """Lead under a new term: write a claim, prove membership with a commit, announce, call ``on_elected``.
        On failure the replica does not lead; while it holds the partition, ``_run`` claims again later."""
        async with self._claiming:
            if self.term is not None or not self._holds_partition:
                return
            assert self._producer is not None
            self._claim_after = time.monotonic() + self.timings.reclaim_after_s
            claim = LeadershipClaimed(occurred_at=self.clock.now(), service=self.service, instance=self.instance)
            try:
                sent = await self._producer.send_and_wait(
                    LEADERSHIP.name, partition=0, **self._sealed(LEADERSHIP.name, encode(claim))
                )
            except KafkaError:
                log.exception("%s: could not write a leadership claim; claiming again shortly", self.instance)
                return
            if not self._holds_partition:
                return  # the group moved the partition while the claim was being written
            term = sent.offset + 1
            self._claimed = sent.offset
            self.term = self._held_term = term
            if not await self._renew():
                return
            await self._elected(term)

    def _sealed(self, topic: str, body: bytes) -> dict[str, Any]:
        """The value, key and headers of a record about this service, sealed where a cluster secret is configured."""
        key = self.service.encode()
        if self._seal is None:
            return {"value": body, "key": key}
        headers = [(name, value.encode()) for name, value in self._seal.headers(topic, key, body).items()]
        return {"value": body, "key": key, "headers": headers}

    async def _elected(self, term: int) -> None:
        assert self._producer is not None
        log.info("%s leads %s under term %d", self.instance, self.service, term)
        elected = LeaderElected(occurred_at=self.clock.now(), service=self.service, instance=self.instance, term=term)
        try:
            await self._producer.send_and_wait(SERVICES.name, **self._sealed(SERVICES.name, encode(elected)))
        except KafkaError:
            log.warning("%s: could not announce term %d", self.instance, term)
        self._announced = True
        self._on_elected(term)

    def _lose(self) -> None:
        if self.term is None:
            return
        log.info("%s no longer leads %s (term %d)", self.instance, self.service, self.term)
        self.term = None
        self._lease_until = 0.0
        if self._announced:
            self._announced = False
            self._on_lost()

    def _resign(self) -> None:
        """The lease could not be renewed in time: stop leading, and claim again (if the partition is still ours)
        only after ``reclaim_after_s``, by which a rebalance under way has taken the partition away."""
        self._held_term = 0
        self._claim_after = time.monotonic() + self.timings.reclaim_after_s
        self._lose()

    async def _renew(self) -> bool:
        """Extend the lease with a commit; True when it holds now. A commit that failed, or that came back after the
        lease it was sent under had run out, or during which the term changed, ends this leadership."""
        async with self._renewing:
            term = self.term
            if term is None or self._consumer is None:
                return False
            sent_at = time.monotonic()
            try:
                await self._consumer.commit({PARTITION: OffsetAndMetadata(self._claimed + 1, self.instance)})
            except KafkaError as exc:
                log.warning("%s: lease not renewed (%s): no longer leader", self.instance, type(exc).__name__)
                self._resign()
                return False
            if self.term != term:
                return False  # lost (a rebalance) while the commit was in flight
            lease_until = sent_at + self.timings.lease_s
            if time.monotonic() >= lease_until:
                log.warning(
                    "%s: lease renewal took %.2f s, past the %.2f s lease: no longer leader",
                    self.instance,
                    time.monotonic() - sent_at,
                    self.timings.lease_s,
                )
                self._resign()
                return False
            self._lease_until = lease_until
            return True

    async def _run(self) -> None:
        """Poll (which drives the group's rebalances) and renew the lease while leading."""
        assert self._consumer is not None
        interval_ms = int(self.timings.renew_interval_s * 1000)
        while True:
            try:
                await self._consumer.getmany(timeout_ms=interval_ms)
                if self.term is not None and self._lease_until - time.monotonic() < self.timings.lease_s / 2:
                    await self._renew()
                elif self.term is None and self._holds_partition and time.monotonic() >= self._claim_after:
                    await self._claim()  # holding the partition without leading: no rebalance would fix that
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: election loop error; retrying", self.instance)
                await asyncio.sleep(interval_ms / 1000)


class _Listener(ConsumerRebalanceListener):
    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        if PARTITION in revoked:
            self.leadership._holds_partition = False
            self.leadership._lose()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.leadership._assigned(set(assigned))
