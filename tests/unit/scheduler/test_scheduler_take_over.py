"""An elected scheduler replica leads: a take-over that fails (the log's end could not be read, a book that could not
be rebuilt) is tried again while the replica is elected, and a replica whose decisions were withheld while it is
still elected rebuilds its book and leads again, instead of holding the leadership without leading."""

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import pytest
from aiokafka.errors import KafkaTimeoutError

from shardyard.events import Event, JobReady, JobScheduled
from shardyard.scheduler import app
from shardyard.scheduler.app import SchedulerReplica, SchedulerSettings
from tests.support.clock import FakeClock
from tests.unit.builders import at, gpus, job_spec, node_state

TERM = 5


class RecordingBus:
    def __init__(self) -> None:
        self.published: list[Event] = []

    async def send(self, event: Event) -> Awaitable[object]:
        self.published.append(event)
        return asyncio.sleep(0)

    async def publish_all(self, events: Iterable[Event]) -> None:
        self.published.extend(events)


@dataclass
class FakeFollower:
    """Reading the log's end fails ``failing`` times (a broker too busy to answer), then works; starting (a rebuild)
    replays the log (``replay``)."""

    failing: int = 0
    started: int = 0
    replay: Callable[[], None] = lambda: None

    async def start(self) -> None:
        self.started += 1
        self.replay()

    async def stop(self) -> None:
        pass

    async def caught_up(self) -> None:
        if self.failing:
            self.failing -= 1
            raise KafkaTimeoutError()


@dataclass
class FakeLeadership:
    term: int | None = TERM

    async def confirm(self, term: int) -> bool:
        return term == self.term

    async def stop(self) -> None:
        pass


def replica(follower: FakeFollower, monkeypatch: pytest.MonkeyPatch) -> tuple[SchedulerReplica, RecordingBus]:
    monkeypatch.setattr(app, "TAKE_OVER_RETRY_S", (0.01, 0.02))
    bus = RecordingBus()
    settings = SchedulerSettings(instance="r0", cycle_interval_s=60)
    new = SchedulerReplica(settings, bus, clock=FakeClock(at(10)))  # type: ignore[arg-type]
    new.leadership = FakeLeadership()  # type: ignore[assignment]
    new.follower = follower  # type: ignore[assignment]
    monkeypatch.setattr(new, "_follower", lambda: follower)

    def replay() -> None:  # the log: one node, one ready job, and what the replica published
        new.handlers.book.apply(node_state("n1", gpus=gpus(count=2)))
        new.handlers.book.apply(JobReady(occurred_at=at(0), job_id="job-1", spec=job_spec(memory_bytes=0)))
        for event in bus.published:
            new.handlers.book.apply(event)

    follower.replay = replay
    replay()
    return new, bus


async def test_a_take_over_that_failed_is_tried_again_while_elected(monkeypatch: pytest.MonkeyPatch) -> None:
    r, bus = replica(FakeFollower(failing=2), monkeypatch)

    await asyncio.wait_for(r._take_over(TERM), timeout=5)

    assert r.handlers.leading and r.handlers.book.term == TERM
    (placed,) = [e for e in bus.published if isinstance(e, JobScheduled)]  # decided on the book rebuilt from the log
    assert placed.term == TERM


async def test_a_take_over_stops_trying_once_the_replica_is_no_longer_elected(monkeypatch: pytest.MonkeyPatch) -> None:
    r, bus = replica(FakeFollower(failing=1_000), monkeypatch)
    trying = asyncio.get_running_loop().create_task(r._take_over(TERM))
    await asyncio.sleep(0.05)

    r.leadership.term = None
    await asyncio.wait_for(trying, timeout=5)

    assert not r.handlers.leading and bus.published == []


async def test_a_replica_whose_decisions_were_withheld_while_still_elected_rebuilds_and_leads_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    follower = FakeFollower()
    r, bus = replica(follower, monkeypatch)
    await r._take_over(TERM)
    assert r.handlers.leading

    r.handlers.leading = False  # what a withheld publication leaves behind (e.g. re-elected while it was in flight)
    r._diverged()
    await asyncio.wait_for(asyncio.gather(*r._tasks), timeout=5)

    assert r.handlers.leading and r.handlers.book.term == TERM and follower.started == 1  # rebuilt from the log
    assert len([e for e in bus.published if isinstance(e, JobScheduled)]) == 1  # the rebuilt book read the placement
