"""A real shard's log, as the node agent writes it: the agent's handlers (no broker: the events they publish are
recorded) take an assignment, launch the built-in runner as a real process with the shard log as its stdout and
stderr, and the log is read back when it has ended. Each event is one line, and there is a progress line (step, loss,
sync count) at every parameter sync; the last one's loss is the shard's final loss."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from shardyard.clock import SystemClock
from shardyard.events import ShardCompleted
from shardyard.node_agent.book import AgentBook
from shardyard.node_agent.environment import RunnerOptions
from shardyard.node_agent.handlers import AgentHandlers
from shardyard.node_agent.identity import NodeIdentity
from shardyard.node_agent.inventory import SimulatedGpus
from shardyard.node_agent.launcher import SubprocessLauncher
from shardyard.training.artifacts import create_demo_artifacts
from shardyard.training.model import TinyGPTConfig
from tests.support import wait
from tests.support.events import Recorder
from tests.support.runners import free_port
from tests.unit.builders import assignment, workload

TEST_MODEL = TinyGPTConfig(n_positions=64, n_embd=32, n_layer=1, n_head=2)
STEPS, SYNC_EVERY = 40, 10
PROGRESS = re.compile(r"^shardyard\.training\[rank 0/1\]: step (\d+)/40 loss (\S+) syncs (\d+) at \S+Z$")


def agent(tmp_path: Path, bus: Recorder) -> AgentHandlers:
    identity = NodeIdentity(
        node_id="node-a",
        instance="node-a-1",
        address="127.0.0.1",
        rendezvous_ports=(29500, 8),
        cpu_cores=2.0,
        memory_bytes=1 << 30,
        mounts={"/data": str(tmp_path / "data")},
        log_dir=tmp_path / "logs",
        python=sys.executable,
        base_env={"SHARDYARD_DEVICE": "cpu"},
        standbys="none",
        runner=RunnerOptions(),
        scratch_dir=tmp_path / "scratch",
    )
    return AgentHandlers(
        identity, AgentBook("node-a"), bus, SystemClock(), SimulatedGpus(["A100:1"]), SubprocessLauncher()
    )


async def test_the_runner_writes_one_line_per_event_and_a_progress_line_at_every_sync(tmp_path: Path) -> None:
    create_demo_artifacts(tmp_path / "data", seed=0, model_config=TEST_MODEL)
    bus = Recorder()
    handlers = agent(tmp_path, bus)
    job = workload(
        model_path="/data/models/gpt2_pretrained",
        output_path="/data/checkpoints/log-job",
        sync_interval=SYNC_EVERY,
        max_steps=STEPS,
        batch_size=4,
        seq_len=32,
    )
    order = assignment(
        "log-job", world_size=1, gpu_indices=(0,), master_addr="127.0.0.1", master_port=free_port(), workload=job
    )

    await handlers.on_assignment(order)
    (done,) = await wait.eventually(lambda: bus.of(ShardCompleted), "the shard's end", 120, every_s=0.1)

    log = (tmp_path / "logs" / "log-job" / "shard-0-attempt-1.log").read_text()
    lines = log.splitlines()
    assert len(lines) == len(set(lines)), log  # no line twice: stdout and stderr are one file, written once
    assert sum("training on cpu over gloo" in line for line in lines) == 1, log
    progress = [PROGRESS.match(line) for line in lines]
    shown = [(int(m.group(1)), int(m.group(3))) for m in progress if m]
    synced = [(step, syncs) for step, syncs in shown if step % SYNC_EVERY == 0]
    assert synced == [(step, step // SYNC_EVERY) for step in range(SYNC_EVERY, STEPS + 1, SYNC_EVERY)], log
    assert shown[0][0] == 1 and shown[-1][0] == STEPS
    last = [m for m in progress if m][-1]
    assert done.final_loss is not None and last.group(2) == f"{done.final_loss:.4g}"  # the log ends on the final loss
    assert lines[-1].endswith("steps/s"), log  # the rate line bench/training.py reads comes last
