"""A node agent as a real process: heartbeats with its simulated GPUs, runs assigned shards as real training
processes, refuses stale terms, reports missing artifacts, and stops revoked shards."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import HEARTBEATS, SERVICES, SHARD_EVENTS
from shardyard.embedded import free_port
from shardyard.events import (
    FailureCause,
    Heartbeat,
    ServiceReady,
    ShardAssignment,
    ShardCompleted,
    ShardFailed,
    ShardProgress,
    ShardRevocation,
    ShardStarted,
    Workload,
)
from shardyard.training.artifacts import create_demo_artifacts
from tests.support.events import Producer, Watcher
from tests.support.processes import service

pytestmark = pytest.mark.broker


def assignment(
    job_id: str, *, term: int = 1, steps: int = 40, model: str = "/data/models/gpt2_pretrained"
) -> ShardAssignment:
    return ShardAssignment(
        occurred_at=datetime.now(UTC),
        job_id=job_id,
        shard_index=0,
        world_size=1,
        node_id="agent-n1",
        gpu_indices=(0,),
        attempt=1,
        term=term,
        master_addr="127.0.0.1",
        master_port=free_port(),
        workload=Workload(
            model_path=model,
            dataset_path="/data/datasets/wikitext",
            output_path=f"/data/checkpoints/{job_id}",
            sync_interval=10,
            max_steps=steps,
            batch_size=4,
            seq_len=32,
            lr=3e-3,
            seed=0,
        ),
    )


async def test_agent_runs_refuses_and_revokes(bootstrap: str, tmp_path: Path, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    data = tmp_path / "data"
    create_demo_artifacts(data)
    args = [
        "--node-id",
        "agent-n1",
        "--gpus",
        "A100:1",
        "--mounts",
        f"/data={data}",
        "--log-dir",
        str(tmp_path / "shards"),
    ]
    with service("shardyard.node_agent", args, bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [HEARTBEATS, SHARD_EVENTS, SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="node-agent", timeout_s=60)
            beat = await watch.first(Heartbeat, node_id="agent-n1")
            assert [g.model for g in beat.gpus] == ["A100"] and beat.gpus[0].simulated

            await send.event(assignment("agent-ok", term=2))
            await watch.first(ShardStarted, job_id="agent-ok", timeout_s=30)
            done = await watch.first(ShardCompleted, job_id="agent-ok", timeout_s=120)
            assert done.final_loss is not None and done.steps == 40
            assert watch.of(ShardProgress, job_id="agent-ok")
            assert (data / "checkpoints" / "agent-ok" / "config.json").is_file()

            await send.event(assignment("agent-missing", term=2, model="/data/models/absent"))
            missing = await watch.first(ShardFailed, job_id="agent-missing")
            assert missing.cause is FailureCause.MISSING_ARTIFACT

            await send.event(assignment("agent-long", term=2, steps=1_000_000))
            await watch.first(ShardProgress, job_id="agent-long", timeout_s=60)
            await send.event(
                ShardRevocation(
                    occurred_at=datetime.now(UTC),
                    job_id="agent-long",
                    shard_index=0,
                    node_id="agent-n1",
                    attempt=1,
                    term=2,
                    reason="test",
                )
            )
            await watch.until(
                lambda: (
                    not [r for r in watch.of(Heartbeat, node_id="agent-n1")[-1].running if r.job_id == "agent-long"]
                    and watch.of(Heartbeat, node_id="agent-n1")[-1].seq > beat.seq + 2
                ),
                timeout_s=30,
                what="the revoked shard gone from heartbeats",
            )
            assert not watch.of(ShardCompleted, job_id="agent-long")

            # An assignment from an older leader term is refused: nothing starts.
            await send.event(assignment("agent-stale", term=1))
            await send.event(assignment("agent-after", term=2, steps=5))
            await watch.first(ShardCompleted, job_id="agent-after", timeout_s=60)
            assert not watch.of(ShardStarted, job_id="agent-stale")
