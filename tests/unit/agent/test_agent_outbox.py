"""The agent's outbox: deadlines on every publish; kept events go out in order per partition key."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from aiokafka.errors import KafkaError

from shardyard.events import Event, ShardCheckpointed, ShardFailed, ShardStarted
from shardyard.events.job import FailureCause
from shardyard.node_agent.outbox import Outbox
from tests.unit.builders import T0


class Bus:
    """Publishes unless ``refuse`` says no for an event: then it raises what ``refuse`` returns (or hangs)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.refuse: Callable[[Event], BaseException | str | None] = lambda event: None

    async def publish(self, event: Event) -> None:
        verdict = self.refuse(event)
        if verdict == "hang":
            await asyncio.Event().wait()
        if isinstance(verdict, BaseException):
            raise verdict
        self.events.append(event)


def started(job: str) -> ShardStarted:
    return ShardStarted(occurred_at=T0, job_id=job, shard_index=0, attempt=1, node_id="node-a", pid=1)


def checkpointed(job: str, step: int) -> ShardCheckpointed:
    return ShardCheckpointed(
        occurred_at=T0, job_id=job, shard_index=0, attempt=1, node_id="node-a", step=step, checkpoint_dir="/c"
    )


def failed(job: str) -> ShardFailed:
    return ShardFailed(
        occurred_at=T0,
        job_id=job,
        shard_index=0,
        attempt=1,
        node_id="node-a",
        cause=FailureCause.REVOKED,
        exit_code=-15,
        message="self-fenced",
    )


async def test_kept_events_go_out_in_order_once_the_bus_is_back() -> None:
    bus = Bus()
    box = Outbox(bus, timeout_s=1.0)
    bus.refuse = lambda event: ConnectionError("down")
    events: list[Event] = [started("a"), checkpointed("a", 10), failed("a")]
    for event in events:
        await box.deliver(event)
    assert (bus.events, box.pending, box.healthy) == ([], events, False)

    bus.refuse = lambda event: None
    later = started("b")
    await box.deliver(later)  # behind what is kept: not before it
    assert bus.events == []
    await box.flush()

    assert bus.events == [*events, later] and box.pending == [] and box.healthy


async def test_an_event_the_broker_refuses_holds_back_only_its_own_key() -> None:
    bus = Bus()
    box = Outbox(bus, timeout_s=1.0)
    bus.refuse = lambda event: ConnectionError("down")
    a1, b1, a2, b2 = checkpointed("a", 10), started("b"), failed("a"), checkpointed("b", 10)
    for event in (a1, b1, a2, b2):
        await box.deliver(event)

    bus.refuse = lambda event: KafkaError("unknown partition") if event in (a1, a2) else None
    await box.flush()

    assert bus.events == [b1, b2]
    assert box.pending == [a1, a2]  # "a" still in order, not lost


async def test_a_flush_ends_at_the_first_event_that_gets_no_answer() -> None:
    bus = Bus()
    box = Outbox(bus, timeout_s=0.05)
    bus.refuse = lambda event: ConnectionError("down")
    kept: list[Event] = [started("a"), started("b"), started("c")]
    for event in kept:
        await box.deliver(event)
    bus.refuse = lambda event: "hang"

    await asyncio.wait_for(box.flush(), timeout=1.0)  # one deadline, not one per event

    assert box.pending == kept and bus.events == []


@pytest.mark.parametrize("error", [TimeoutError(), OSError("refused"), KafkaError("x")], ids=["timeout", "os", "kafka"])
async def test_publish_reports_failure_without_raising(error: Exception) -> None:
    bus = Bus()
    bus.refuse = lambda event: error
    box = Outbox(bus, timeout_s=1.0)

    assert not await box.publish(started("a"))
    assert not box.healthy


async def test_a_bug_is_not_mistaken_for_a_lost_bus() -> None:
    bus = Bus()
    bus.refuse = lambda event: ValueError("cannot encode")
    box = Outbox(bus, timeout_s=1.0)

    with pytest.raises(ValueError, match="encode"):
        await box.publish(started("a"))
