"""Heartbeats become node state; silence makes a node SUSPECT, then LOST with a node-lost event; an operator's drain
mark is published at once and kept across heartbeats and pool restarts; a reservation its agent never runs comes
free after the start deadline and the grace."""

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import FAILURES, HEARTBEATS, NODE_STATE, SERVICES
from shardyard.events import (
    ArtifactPlace,
    GpuStatus,
    Heartbeat,
    NodeDrain,
    NodeLost,
    NodeState,
    NodeStatus,
    ServiceReady,
    ShardAssignment,
    Workload,
)
from tests.support.events import Producer, Watcher
from tests.support.processes import service
from tests.support.replicas import one_key_per_partition, published
from tests.support.runners import free_port

pytestmark = pytest.mark.broker


def heartbeat(node_id: str, seq: int) -> Heartbeat:
    return Heartbeat(
        occurred_at=datetime.now(UTC),
        node_id=node_id,
        agent_instance="agent-1",
        seq=seq,
        host="test",
        address="127.0.0.1",
        rendezvous_ports=(30000, 10),
        gpus=(GpuStatus(index=0, model="A100", tflops=35, memory_bytes=80 * 1024**3, simulated=True),),
        cpu_cores=16,
        memory_bytes=128 * 1024**3,
        cpu_load=0.1,
    )


async def test_liveness(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    args = ["--suspect-after-s", "1", "--lost-after-s", "2.5"]
    with service("shardyard.resource_pool", args, bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [NODE_STATE, FAILURES, SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="resource-pool", timeout_s=60)
            await send.event(heartbeat("pool-n1", 1))
            alive = await watch.first(NodeState, node_id="pool-n1", status=NodeStatus.ALIVE)
            assert alive.gpus[0].model == "A100"
            await watch.first(NodeState, node_id="pool-n1", status=NodeStatus.SUSPECT, timeout_s=10)
            await watch.first(NodeState, node_id="pool-n1", status=NodeStatus.LOST, timeout_s=10)
            lost = await watch.first(NodeLost, node_id="pool-n1")
            assert lost.silent_for_s >= 2.5 - 0.1  # LOST by 2.5 s of silence: at a check (0.1 s) at most early
            await send.event(heartbeat("pool-n1", 2))
            await watch.until(
                lambda: watch.of(NodeState, node_id="pool-n1")[-1].status is NodeStatus.ALIVE, what="ALIVE again"
            )
            assert len(watch.of(NodeLost, node_id="pool-n1")) == 1


async def test_drain_is_published_at_once_and_outlives_heartbeats_and_restarts(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    artifacts: dict[str, ArtifactPlace] = {"/data/models/gpt2": "local", "/data/datasets/wikitext": "shared"}
    topology = {"zone": "z1", "rack": "r1"}

    def beat(seq: int) -> Heartbeat:
        # Each beat's load differs by more than the pool's step, so each one changes the node's state.
        update = {"artifacts": artifacts, "topology": topology, "cpu_load": 0.1 * seq}
        return heartbeat("drain-n1", seq).model_copy(update=update)

    def latest() -> NodeState:
        states: list[NodeState] = watch.of(NodeState, node_id="drain-n1")
        return states[-1]

    async with Watcher(bootstrap, [NODE_STATE, SERVICES]) as watch, Producer(bootstrap) as send:
        with service("shardyard.resource_pool", ["--instance", "p-1"], bootstrap=bootstrap, log_dir=log_dir):
            await watch.until(lambda: watch.of(ServiceReady, instance="p-1"), timeout_s=60)
            await send.event(beat(1))
            first = await watch.first(NodeState, node_id="drain-n1")
            assert (first.artifacts, first.topology, first.draining) == (artifacts, topology, False)

            await send.event(NodeDrain(occurred_at=datetime.now(UTC), node_id="drain-n1", draining=True))
            drained = await watch.first(NodeState, node_id="drain-n1", draining=True)
            assert drained.status is NodeStatus.ALIVE
            await send.event(beat(2))
            await watch.until(lambda: len(watch.of(NodeState, node_id="drain-n1")) >= 3, what="the next state")
            assert latest().draining is True

        with service("shardyard.resource_pool", ["--instance", "p-2"], bootstrap=bootstrap, log_dir=log_dir):
            await watch.until(lambda: watch.of(ServiceReady, instance="p-2"), timeout_s=60)
            seen = len(watch.of(NodeState, node_id="drain-n1"))
            await send.event(beat(3))
            await watch.until(lambda: len(watch.of(NodeState, node_id="drain-n1")) > seen, what="state after restart")
            after = latest()
            assert (after.draining, after.artifacts, after.topology) == (True, artifacts, topology)

            await send.event(NodeDrain(occurred_at=datetime.now(UTC), node_id="drain-n1", draining=False))
            await watch.until(lambda: latest().draining is False, what="undrained")


async def test_two_replicas_split_the_nodes_and_one_takes_them_all_over_when_the_other_dies(
    bootstrap: str, log_dir: Path
) -> None:
    await ensure_topics(bootstrap)
    nodes = one_key_per_partition("split-n", HEARTBEATS)  # one node on every partition of the heartbeats topic
    ports = [free_port(), free_port()]
    logs = log_dir / "split"
    replicas = [["--instance", f"split-{i}", "--metrics-port", str(ports[i])] for i in (0, 1)]
    beating = set(nodes.values())
    seq = 0

    async def beat() -> None:
        nonlocal seq
        while True:
            seq += 1
            for node in sorted(beating):
                await send.event(heartbeat(node, seq))
            await asyncio.sleep(0.5)

    async with Watcher(bootstrap, [NODE_STATE, SERVICES]) as watch, Producer(bootstrap) as send:
        with (
            service("shardyard.resource_pool", replicas[0], bootstrap=bootstrap, log_dir=logs) as first,
            service("shardyard.resource_pool", replicas[1], bootstrap=bootstrap, log_dir=logs),
        ):
            await watch.until(lambda: len(watch.of(ServiceReady, service="resource-pool")) >= 2, timeout_s=60)
            beats = asyncio.create_task(beat())
            try:
                for node in nodes.values():
                    await watch.first(NodeState, node_id=node, status=NodeStatus.ALIVE, timeout_s=30)
                # Both replicas work: each publishes the states of the nodes of its partitions.
                await watch.until(
                    lambda: all(published(port, NODE_STATE) > 0 for port in ports), timeout_s=60, what="both publishing"
                )

                survivor_log = next(p for p in logs.iterdir() if "split-1" in p.read_text(errors="replace"))
                owns_all = (
                    f"split-1 judges the nodes of {HEARTBEATS.name} partitions {list(range(HEARTBEATS.partitions))}"
                )
                before = survivor_log.read_text().count(owns_all)  # it may have been alone at first
                first.kill()  # SIGKILL: its partitions go to the survivor after the group's session timeout
                await watch.until(
                    lambda: survivor_log.read_text().count(owns_all) > before,
                    timeout_s=60,
                    what="the survivor owning every partition",
                )
                suspected = {s.node_id for s in watch.of(NodeState, status=NodeStatus.SUSPECT)}
                assert suspected.isdisjoint(nodes.values())  # no node was suspected in the handover

                beating.clear()  # every node goes silent: the survivor judges them all
                for node in nodes.values():
                    await watch.first(NodeState, node_id=node, status=NodeStatus.SUSPECT, timeout_s=15)
            finally:
                beats.cancel()


async def test_a_reservation_its_agent_never_runs_comes_free_after_the_start_deadline_and_the_grace(
    bootstrap: str, log_dir: Path
) -> None:
    """An assignment reserves a GPU on a node whose agent heartbeats (full heartbeats, running nothing) and never
    runs it; no end is ever reported. Past the start deadline (1 s) and the grace (1.5 s) the GPU comes free."""
    await ensure_topics(bootstrap)
    node = "orphan-n1"
    args = ["--instance", "orphan-p", "--start-deadline-s", "1", "--reservation-grace-s", "1.5"]
    seq = 0

    async def beat() -> None:
        nonlocal seq
        while True:
            seq += 1
            await send.event(heartbeat(node, seq))  # running=(): the agent runs nothing
            await asyncio.sleep(0.5)

    def states() -> list[NodeState]:
        return watch.of(NodeState, node_id=node)

    with service("shardyard.resource_pool", args, bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [NODE_STATE, SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.until(lambda: watch.of(ServiceReady, instance="orphan-p"), timeout_s=60)
            beats = asyncio.create_task(beat())
            try:
                await watch.first(NodeState, node_id=node, status=NodeStatus.ALIVE, timeout_s=30)
                assigned_at = datetime.now(UTC)
                await send.event(
                    ShardAssignment(
                        occurred_at=assigned_at,
                        job_id="orphan-job",
                        shard_index=0,
                        world_size=1,
                        node_id=node,
                        gpu_indices=(0,),
                        attempt=1,
                        term=1,
                        master_addr="127.0.0.1",
                        master_port=30000,
                        workload=Workload(
                            model_path="/data/models/m",
                            dataset_path="/data/datasets/d",
                            output_path="/data/checkpoints/orphan-job",
                            sync_interval=10,
                            max_steps=10,
                            batch_size=1,
                            seq_len=8,
                            lr=1e-3,
                            seed=0,
                        ),
                    )
                )
                await watch.until(lambda: any(s.allocated_gpus == (0,) for s in states()), what="the reservation")
                reserved = next(i for i, s in enumerate(states()) if s.allocated_gpus == (0,))
                freed = await watch.until(
                    lambda: [s for s in states()[reserved:] if s.allocated_gpus == ()], timeout_s=30, what="free"
                )
            finally:
                beats.cancel()
            held_s = (freed[0].occurred_at - assigned_at).total_seconds()
            assert held_s > 1 + 1.5, f"released after {held_s:.1f} s: within the start deadline and the grace"
            assert freed[0].status is NodeStatus.ALIVE
