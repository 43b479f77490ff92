"""The agent without its bus: heartbeats that fail or hang do not renew the lease, an expired lease stops every
shard (self-fencing), and what must not be lost (starts, checkpoints, ends) goes out once the bus is back. Also:
spares start nothing, checkpoint reports become events."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from shardyard.events import (
    Event,
    FailureCause,
    Heartbeat,
    NodeLease,
    ShardCheckpointed,
    ShardFailed,
    ShardProgress,
    ShardStarted,
)
from shardyard.node_agent.book import AgentBook
from shardyard.node_agent.handlers import AgentHandlers
from shardyard.node_agent.identity import NodeIdentity
from shardyard.node_agent.inventory import SimulatedGpus
from shardyard.node_agent.launcher import LaunchSpec
from shardyard.training.lease import margin
from tests.support import wait
from tests.support.clock import FakeClock
from tests.unit.agent.test_agent_handlers import FakeDisk, FakeLauncher, FakeProcess
from tests.unit.builders import T0, assignment, workload


class Bus:
    """A bus that can be up, down (publishes fail at once) or hung (publishes never return)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.state = "up"

    async def publish(self, event: Event) -> None:
        if self.state == "down":
            raise ConnectionError("broker unreachable")
        if self.state == "hung":
            await asyncio.Event().wait()
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


class Agent:
    def __init__(self, tmp_path: Path, *, lease_s: float = 6.0, launcher: Any = None) -> None:
        self.root = tmp_path / "data"
        for name in ("models/gpt2", "datasets/wikitext"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        self.bus = Bus()
        self.clock = FakeClock(T0)
        self.launcher = launcher or FakeLauncher()
        identity = NodeIdentity(
            node_id="node-a",
            instance="node-a-1",
            address="127.0.0.1",
            rendezvous_ports=(29500, 8),
            cpu_cores=8.0,
            memory_bytes=1 << 30,
            mounts={"/data": str(self.root)},
            log_dir=tmp_path / "logs",
            python="python",
            base_env={},
        )
        self.handlers = AgentHandlers(
            identity,
            AgentBook("node-a"),
            self.bus,
            self.clock,
            SimulatedGpus(["A100:4"]),
            self.launcher,
            disk=FakeDisk(),
            host_load=lambda: 0.0,
            lease_s=lease_s,
        )

    async def until(self, condition: Any, timeout_s: float = 5.0) -> Any:
        return await wait.eventually(condition, "the agent's condition", timeout_s, every_s=0.01)


async def test_a_lost_bus_fences_the_shards_and_their_end_goes_out_once_it_is_back(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    await agent.handlers.on_assignment(assignment(world_size=1))
    (process,) = agent.launcher.processes
    await agent.handlers.heartbeat()  # t=0: the lease runs from here
    agent.bus.state = "down"

    agent.clock.move_to(3.0)
    await agent.handlers.heartbeat()  # fails: no renewal
    await agent.handlers.check_lease()
    assert not process.exit.done()
    agent.clock.move_to(6.5)
    await agent.handlers.check_lease()

    assert process.exit.done() and process.exit.result() == -15  # SIGTERM (SIGKILL follows after the grace)
    await agent.until(lambda: not agent.handlers.tasks)
    assert agent.bus.of(ShardFailed) == [] and len(agent.handlers.outbox.pending) == 1

    agent.bus.state = "up"
    agent.clock.move_to(9.0)
    await agent.handlers.heartbeat()

    (failed,) = agent.bus.of(ShardFailed)
    assert (failed.cause, failed.exit_code, failed.message) == (
        FailureCause.FENCED,
        -15,
        "self-fenced: bus unreachable for 6.5 s",
    )
    assert not agent.handlers.outbox.pending
    assert not agent.bus.of(Heartbeat)[-1].running


async def test_a_hung_publish_times_out_and_does_not_renew_the_lease(tmp_path: Path) -> None:
    agent = Agent(tmp_path, lease_s=0.2)
    await agent.handlers.on_assignment(assignment(world_size=1))
    (process,) = agent.launcher.processes
    agent.bus.state = "hung"
    agent.clock.move_to(0.1)

    await asyncio.wait_for(agent.handlers.heartbeat(), timeout=5.0)  # the publish gives up after the lease

    assert agent.handlers.bus_ok_at == 0.0
    agent.clock.move_to(0.25)
    await agent.handlers.check_lease()
    assert process.exit.done()


async def test_heartbeats_renew_the_lease(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    await agent.handlers.on_assignment(assignment(world_size=1))
    for t in range(1, 20):
        agent.clock.move_to(float(t))
        await agent.handlers.heartbeat()
        await agent.handlers.check_lease()

    assert not agent.launcher.processes[0].exit.done()
    assert agent.handlers.bus_ok_at == 19.0


async def test_a_stalled_agent_says_so_in_its_beats_and_its_shards_lease_lasts_as_much_longer(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    beats = agent.handlers.heartbeats
    beats.lease_file = str(tmp_path / "node-a.lease")  # what the agent's shards watch
    agent.clock.move_to(1.0)
    await agent.handlers.heartbeat()
    assert agent.bus.of(Heartbeat)[-1].margin_s == 0.0
    assert margin(str(beats.lease_file)) == 0.0

    beats.stalls.add(1.5, 1.2)  # the host held the agent 1.2 s (its loop's lag, measured by LoopLag)
    agent.clock.move_to(2.0)
    await agent.handlers.heartbeat()
    (lease,) = agent.bus.of(NodeLease)
    assert lease.margin_s == 2.4 and margin(str(beats.lease_file)) == 2.4

    agent.clock.move_to(70.0)  # a calm minute later, the margin is gone
    await agent.handlers.heartbeat()
    assert agent.bus.events[-1].margin_s == 0.0 and margin(str(beats.lease_file)) == 0.0  # type: ignore[attr-defined]


async def test_while_the_bus_is_down_progress_is_dropped_and_the_rest_kept_in_order(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    agent.bus.state = "down"
    await agent.handlers.on_assignment(assignment(world_size=1, workload=workload(output_path="/data/out/job-1")))
    (process,) = agent.launcher.processes
    process.report(kind="progress", step=10, cpu_percent=90.0, sync_interval=10)
    process.report(kind="checkpointed", step=10, checkpoint_dir=str(agent.root / "out/job-1/checkpoint"))
    process.report(kind="progress", step=20, cpu_percent=90.0, sync_interval=20)
    await agent.until(lambda: len(agent.handlers.outbox.pending) == 2)

    agent.bus.state = "up"
    await agent.handlers.heartbeat()

    assert [type(e) for e in agent.bus.events] == [Heartbeat, ShardStarted, ShardCheckpointed]
    (checkpointed,) = agent.bus.of(ShardCheckpointed)
    assert (checkpointed.step, checkpointed.checkpoint_dir) == (10, "/data/out/job-1/checkpoint")
    process.report(kind="progress", step=30, cpu_percent=90.0)
    await agent.until(lambda: agent.bus.of(ShardProgress))
    process.end(0)
    await agent.until(lambda: not agent.handlers.tasks)


async def test_a_spare_starts_nothing_and_is_not_running(tmp_path: Path) -> None:
    agent = Agent(tmp_path)

    await agent.handlers.on_assignment(assignment(shard_index=2, spare=True))
    await agent.handlers.heartbeat()

    assert agent.launcher.specs == []
    assert [type(e) for e in agent.bus.events] == [Heartbeat]
    assert agent.bus.of(Heartbeat)[0].running == ()


class GatedLauncher(FakeLauncher):
    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def launch(self, spec: LaunchSpec, *, progress_env: str) -> FakeProcess:
        await self.gate.wait()
        return await super().launch(spec, progress_env=progress_env)


async def test_a_shard_fenced_while_it_was_being_started_is_stopped_at_once(tmp_path: Path) -> None:
    launcher = GatedLauncher()
    agent = Agent(tmp_path, launcher=launcher)
    starting = asyncio.create_task(agent.handlers.on_assignment(assignment(world_size=1)))
    await asyncio.sleep(0)
    agent.clock.move_to(7.0)
    await agent.handlers.check_lease()

    launcher.gate.set()
    await starting

    (process,) = launcher.processes
    assert process.exit.done()
    await agent.until(lambda: agent.bus.of(ShardFailed))
    assert agent.bus.of(ShardFailed)[0].cause is FailureCause.FENCED
