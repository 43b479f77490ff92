"""The lease, against a small fake group member: a renewal that came back late, or during which the term changed,
ends the leadership; decisions are confirmed only for the term they were made under; a replica that holds the
partition but lost its leadership without a rebalance (a claim it could not write, a renewal that failed) claims
again under a new term instead of leaving the service without a leader."""

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import KafkaTimeoutError

from shardyard.bus.leadership import PARTITION, ElectionTimings, Leadership
from shardyard.clock import SystemClock
from tests.support import wait

TIMINGS = ElectionTimings(
    session_timeout_ms=600,
    heartbeat_interval_ms=100,
    rebalance_timeout_ms=400,
    lease_s=0.2,
    renew_interval_s=0.05,
    reclaim_after_s=0.1,
)
DEADLINE_S = 5.0


@dataclass
class Sent:
    offset: int


@dataclass
class FakeProducer:
    """Writes claims and announcements to one counter; the next ``failing`` sends fail as a busy broker's would."""

    failing: int = 0
    sent: list[str] = field(default_factory=list)

    async def send_and_wait(self, topic: str, value: bytes, **_: Any) -> Sent:
        if self.failing:
            self.failing -= 1
            raise KafkaTimeoutError()
        self.sent.append(topic)
        return Sent(len(self.sent) - 1)


@dataclass
class FakeMember:
    """The group member: commits take ``delay`` seconds, the next ``failing`` fail; ``during`` runs mid-commit."""

    delay: float = 0.0
    failing: int = 0
    during: Callable[[], None] | None = None

    async def commit(self, _offsets: object) -> None:
        if self.during is not None:
            self.during()
        await asyncio.sleep(self.delay)
        if self.failing:
            self.failing -= 1
            raise KafkaTimeoutError()

    async def getmany(self, timeout_ms: int) -> dict[object, list[object]]:
        await asyncio.sleep(timeout_ms / 1000)
        return {}


@dataclass
class Replica:
    leadership: Leadership
    member: FakeMember
    producer: FakeProducer
    elected: list[int]
    lost: list[None]


def replica() -> Replica:
    elected: list[int] = []
    lost: list[None] = []
    leadership = Leadership(
        "unused:9092",
        service="scheduler",
        instance="r0",
        clock=SystemClock(),
        on_elected=elected.append,
        on_lost=lambda: lost.append(None),
        timings=TIMINGS,
    )
    member, producer = FakeMember(), FakeProducer()
    leadership._consumer = member
    leadership._producer = producer
    return Replica(leadership, member, producer, elected, lost)


@contextmanager
def polling(leadership: Leadership) -> Iterator[None]:
    task = asyncio.get_running_loop().create_task(leadership._run())
    try:
        yield
    finally:
        task.cancel()


async def until(condition: Callable[[], bool], what: str) -> None:
    await wait.eventually(condition, what, DEADLINE_S, every_s=0.01)


async def test_a_renewal_that_came_back_after_its_lease_ran_out_ends_the_leadership() -> None:
    r = replica()
    await r.leadership._assigned({PARTITION})
    (term,) = r.elected
    r.leadership._lease_until = 0.0  # the lease ran out (a stalled process, a busy broker)
    r.member.delay = TIMINGS.lease_s + 0.05  # and the commit that would renew it answers late

    assert await r.leadership.confirm(term) is False
    assert r.leadership.term is None and r.lost == [None]


async def test_a_renewal_during_which_the_term_changed_confirms_nothing() -> None:
    r = replica()
    await r.leadership._assigned({PARTITION})
    (term,) = r.elected
    r.leadership._lease_until = 0.0
    r.member.during = r.leadership._lose  # a rebalance took the partition while the commit was in flight

    assert await r.leadership.confirm(term) is False


async def test_decisions_are_confirmed_only_for_the_term_they_were_made_under() -> None:
    r = replica()
    await r.leadership._assigned({PARTITION})
    (term,) = r.elected

    assert await r.leadership.confirm(term) is True
    assert await r.leadership.confirm(term - 1) is False  # an earlier leadership of this replica's


async def test_a_replica_whose_claim_failed_claims_again_while_it_holds_the_partition() -> None:
    r = replica()
    r.producer.failing = 1  # the claim cannot be written: no rebalance is coming to retry it
    await r.leadership._assigned({PARTITION})
    assert r.leadership.term is None and r.elected == []

    with polling(r.leadership):
        await until(lambda: r.elected != [], "a claim under a new term")

    assert r.leadership.term == r.elected[0]


async def test_a_lease_lost_without_a_rebalance_is_claimed_again_under_a_new_term() -> None:
    r = replica()
    await r.leadership._assigned({PARTITION})
    (first,) = r.elected
    r.member.failing = 1  # the next renewal fails (a timeout), the group keeps the partition with this member

    with polling(r.leadership):
        await until(lambda: len(r.elected) == 2, "a second election")

    assert r.lost == [None] and r.elected[1] > first and r.leadership.term == r.elected[1]


async def test_a_replica_whose_partition_went_elsewhere_does_not_claim() -> None:
    r = replica()
    r.producer.failing = 1
    await r.leadership._assigned({PARTITION})
    await r.leadership._assigned(set())  # the next rebalance gave the partition to another member

    with polling(r.leadership):
        await asyncio.sleep(3 * TIMINGS.reclaim_after_s)  # three chances to claim: what must not happen, bounded

    assert r.elected == [] and r.producer.sent == []
