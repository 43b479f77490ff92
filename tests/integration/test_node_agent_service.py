"""A node agent as a real process: heartbeats with its simulated GPUs, runs assigned shards as real training
processes (which checkpoint at every sync), refuses stale terms, holds spares without starting anything, reports
missing artifacts, stops revoked shards, reports the artifacts of live jobs as they appear, checkpoints and stops a
shard on a stop request (then resumes it), and stops its shards when it loses the broker (self-fencing)."""

import asyncio
import json
import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shardyard.broker.ports import free_port
from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import HEARTBEATS, NODE_STATE, SERVICES, SHARD_EVENTS
from shardyard.events import (
    ArtifactErrorReason,
    FailureCause,
    Heartbeat,
    JobAccepted,
    JobCancelled,
    JobSpec,
    NodeLease,
    NodeState,
    NodeStatus,
    RevocationReason,
    ServiceReady,
    ShardAssignment,
    ShardCheckpointed,
    ShardCompleted,
    ShardFailed,
    ShardPreempted,
    ShardProgress,
    ShardRevocation,
    ShardStarted,
    ShardStopRequest,
    StopReason,
    Workload,
)
from shardyard.service import SHUTDOWN_GRACE_S
from shardyard.training.artifacts import create_demo_artifacts
from tests.support.broker import own_broker
from tests.support.events import Producer, Watcher
from tests.support.processes import service

pytestmark = pytest.mark.broker


def assignment(
    job_id: str,
    *,
    term: int = 1,
    steps: int = 40,
    model: str = "/data/models/gpt2_pretrained",
    node_id: str = "agent-n1",
    attempt: int = 1,
    resume_from: str | None = None,
    shard_index: int = 0,
    spare: bool = False,
) -> ShardAssignment:
    return ShardAssignment(
        occurred_at=datetime.now(UTC),
        job_id=job_id,
        shard_index=shard_index,
        world_size=1,
        node_id=node_id,
        gpu_indices=(0,),
        attempt=attempt,
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
            resume_from=resume_from,
        ),
        spare=spare,
    )


def accepted(job_id: str, *, model: str, dataset: str) -> JobAccepted:
    now = datetime.now(UTC)
    spec = JobSpec(
        job_id=job_id,
        task_type="micro_train",
        priority=0,
        gpu_count=1,
        gpu_model="A100",
        min_tflops=35.0,
        memory_bytes=1 << 30,
        cpu_cores=1.0,
        model_path=model,
        dataset_path=dataset,
        shard_count=1,
        sync_interval=10,
        max_steps=40,
        batch_size=4,
        seq_len=32,
        lr=3e-3,
        seed=0,
        submitted_at=now,
    )
    return JobAccepted(occurred_at=now, job_id=job_id, spec=spec, source_offset=f"test/0/{job_id}")


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
        *("--status-refresh-s", "1"),  # every beat a full heartbeat: what this test reads (not leases)
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
            # A checkpoint at every sync but the last (steps 10, 20, 30 of 40), named by its job path.
            checkpoints = watch.of(ShardCheckpointed, job_id="agent-ok")
            assert [c.step for c in checkpoints] == [10, 20, 30]
            assert {c.checkpoint_dir for c in checkpoints} == {"/data/checkpoints/agent-ok/checkpoint"}

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
                    reason=RevocationReason.CANCELLED,
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

            # A spare is held: no shard process, not running (a warm standby waits for it); its revocation just
            # drops it.
            await send.event(assignment("agent-spare", term=2, steps=1_000_000, shard_index=1, spare=True))
            await send.event(assignment("agent-marker", term=2, steps=5))  # after the spare, in the same partition
            await watch.first(ShardCompleted, job_id="agent-marker", timeout_s=60)
            seq = watch.of(Heartbeat, node_id="agent-n1")[-1].seq
            await watch.until(lambda: watch.of(Heartbeat, node_id="agent-n1")[-1].seq >= seq + 2, what="2 heartbeats")
            assert not [
                r for b in watch.of(Heartbeat, node_id="agent-n1") for r in b.running if r.job_id == "agent-spare"
            ]
            spare_logs = tmp_path / "shards" / "agent-spare"
            assert not list(spare_logs.glob("shard-*.log"))  # no shard log: no shard was started
            assert [p.name for p in spare_logs.glob("standby-*.log")] == ["standby-agent-n1-1.log"]
            await send.event(
                ShardRevocation(
                    occurred_at=datetime.now(UTC),
                    job_id="agent-spare",
                    shard_index=1,
                    node_id="agent-n1",
                    attempt=1,
                    term=2,
                    reason=RevocationReason.JOB_SUCCEEDED,
                )
            )
            await send.event(assignment("agent-marker-2", term=2, steps=5))
            await watch.first(ShardCompleted, job_id="agent-marker-2", timeout_s=60)
            assert not [e for e in watch.events if getattr(e, "job_id", None) == "agent-spare"]


async def test_agent_reports_artifacts_as_they_appear_and_preempts_on_request(
    bootstrap: str, tmp_path: Path, log_dir: Path
) -> None:
    await ensure_topics(bootstrap)
    data = tmp_path / "data"
    create_demo_artifacts(data)
    (data / "shared" / "models" / "m").mkdir(parents=True)
    node = "agent-n2"
    args = [
        *("--node-id", node, "--gpus", "A100:1", "--mounts", f"/data={data}", "--log-dir", str(tmp_path / "shards")),
        *("--shared-mounts", "/data/shared", "--cpu-cores", "8", "--zone", "z1", "--rack", "r7"),
        *("--status-refresh-s", "1"),  # every beat a full heartbeat: what this test reads (not leases)
    ]
    model, shared_model, late = "/data/models/gpt2_pretrained", "/data/shared/models/m", "/data/datasets/late"

    def last_beat() -> Heartbeat | None:
        beats = watch.of(Heartbeat, node_id=node)
        return beats[-1] if beats else None

    def artifacts() -> dict[str, str]:
        beat = last_beat()
        return dict(beat.artifacts) if beat else {}

    with service("shardyard.node_agent", args, bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [HEARTBEATS, SHARD_EVENTS, SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="node-agent", instance=node, timeout_s=60)
            beat = await watch.first(Heartbeat, node_id=node)
            assert beat.topology == {"zone": "z1", "rack": "r7"}
            assert [(g.tflops, g.tflops_source) for g in beat.gpus] == [(35.0, "catalogue")]  # simulated: no bench

            # (a) Two live jobs name a local model, a shared one and a dataset that is not here yet.
            sent = time.monotonic()
            await send.event(accepted("art-1", model=model, dataset=late))
            await watch.until(lambda: model in artifacts(), what="the model of a new job, already here")
            known_s = time.monotonic() - sent
            await send.event(accepted("art-2", model=shared_model, dataset=late))
            await watch.until(
                lambda: artifacts() == {model: "local", shared_model: "shared"}, what="the models, not the dataset"
            )
            seq = watch.of(Heartbeat, node_id=node)[-1].seq
            await watch.until(lambda: last_beat().seq >= seq + 2, what="two more heartbeats")  # type: ignore[union-attr]
            assert late not in artifacts()  # still absent, still not reported

            (data / "datasets" / "late").mkdir()
            created = time.monotonic()
            await watch.until(lambda: late in artifacts(), timeout_s=10, what="the dataset reported")
            appeared_s = time.monotonic() - created
            assert appeared_s < 2.0
            print(
                f"\nJobAccepted sent -> heartbeat with its (present) model seen after {known_s:.3f} s;"
                f" dataset directory created -> heartbeat reporting it seen after {appeared_s:.3f} s"
            )

            await send.event(JobCancelled(occurred_at=datetime.now(UTC), job_id="art-2", message="test"))
            await watch.until(lambda: shared_model not in artifacts(), what="the cancelled job's model unwatched")
            assert artifacts() == {model: "local", late: "local"}  # art-1 still names them

            # (b) A stop request: the shard checkpoints at its next sync and reports ShardPreempted.
            await send.event(assignment("agent-preempt", term=2, steps=1_000_000, node_id=node))
            await watch.first(ShardProgress, job_id="agent-preempt", timeout_s=60)
            busy = await watch.until(
                lambda: [b for b in watch.of(Heartbeat, node_id=node) if b.running and b.cpu_load > 0],
                what="a heartbeat with the shard's CPU use",
            )
            assert 0 < busy[-1].cpu_load < 0.5  # one shard of 8 declared cores, whatever the host's load
            await send.event(
                ShardStopRequest(
                    occurred_at=datetime.now(UTC),
                    job_id="agent-preempt",
                    shard_index=0,
                    node_id=node,
                    attempt=1,
                    term=2,
                    reason=StopReason.PREEMPTED,
                )
            )
            preempted = await watch.first(ShardPreempted, job_id="agent-preempt", timeout_s=60)
            assert preempted.step is not None and preempted.step > 0  # at once on the notice, not at a sync (issue 34)
            assert preempted.checkpoint_dir == "/data/checkpoints/agent-preempt/checkpoint"
            state = json.loads((data / "checkpoints" / "agent-preempt" / "checkpoint" / "state.json").read_text())
            assert state["step"] == preempted.step
            assert not watch.of(ShardFailed, job_id="agent-preempt")

            # ...and resumes from the checkpoint (a job path, through the mounts) to its max_steps.
            steps = preempted.step + 20
            await send.event(
                assignment(
                    "agent-preempt",
                    term=2,
                    steps=steps,
                    node_id=node,
                    attempt=2,
                    resume_from=preempted.checkpoint_dir,
                )
            )
            done = await watch.first(ShardCompleted, job_id="agent-preempt", attempt=2, timeout_s=60)
            assert done.steps == steps and done.final_loss is not None
            first = watch.of(ShardProgress, job_id="agent-preempt", attempt=2)[0]
            assert first.step == preempted.step + 1


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not yet reaped, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def _shard_gone(pid: int, *, within_s: float) -> float:
    """Seconds until ``pid`` is dead; fails past ``within_s``."""
    t0 = time.monotonic()
    while _alive(pid):
        assert time.monotonic() - t0 < within_s, f"shard {pid} still alive {time.monotonic() - t0:.1f} s on"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def _start_long_shard(bootstrap: str, job_id: str, node: str) -> ShardStarted:
    async with Watcher(bootstrap, [SHARD_EVENTS, SERVICES]) as watch, Producer(bootstrap) as send:
        await watch.first(ServiceReady, service="node-agent", instance=node, timeout_s=60)
        await send.event(assignment(job_id, term=1, steps=1_000_000, node_id=node))
        started: ShardStarted = await watch.first(ShardStarted, job_id=job_id, timeout_s=60)
        await watch.first(ShardProgress, job_id=job_id, timeout_s=60)
    assert _alive(started.pid)
    return started


async def test_an_agent_that_loses_the_broker_stops_its_shards(tmp_path: Path, log_dir: Path, broker_kind: str) -> None:
    """Self-fencing against a broker this test owns: first it hangs (SIGSTOP: publishes get no answer), then it is
    back (SIGCONT, its log intact) and hears of the fenced shard; then it dies for good (its process stopped)."""
    lease_s, grace_s = 2.0, 5.0
    bound_s = lease_s + grace_s + 3.0  # + up to a heartbeat interval and a lease check, slack
    data = tmp_path / "data"
    create_demo_artifacts(data)
    node = "agent-fence"
    args = [
        *("--node-id", node, "--gpus", "A100:1", "--mounts", f"/data={data}", "--log-dir", str(tmp_path / "shards")),
        *("--lease-s", str(lease_s)),
    ]
    broker = own_broker("kafka" if broker_kind == "external" else broker_kind, tmp_path / "broker").start()
    assert broker.pid is not None
    try:
        await ensure_topics(broker.bootstrap)
        with service("shardyard.node_agent", args, bootstrap=broker.bootstrap, log_dir=log_dir) as agent:
            hung = await _start_long_shard(broker.bootstrap, "agent-hung-bus", node)
            os.kill(broker.pid, signal.SIGSTOP)
            try:
                hung_s = await _shard_gone(hung.pid, within_s=bound_s)
            finally:
                os.kill(broker.pid, signal.SIGCONT)
            async with Watcher(broker.bootstrap, [SHARD_EVENTS]) as watch:
                failed = await watch.first(ShardFailed, job_id="agent-hung-bus", timeout_s=60)
            assert failed.cause is FailureCause.FENCED
            assert failed.message.startswith("self-fenced: bus unreachable for")

            dead = await _start_long_shard(broker.bootstrap, "agent-dead-bus", node)
            os.kill(broker.pid, signal.SIGKILL)
            dead_s = await _shard_gone(dead.pid, within_s=bound_s)
            assert agent.poll() is None  # the agent itself lives on, waiting for the bus

            # Told to stop now, it stops, though the broker it would say goodbye to is gone.
            t0 = time.monotonic()
            agent.send_signal(signal.SIGTERM)
            rc = agent.wait(SHUTDOWN_GRACE_S + 10)
            stop_s = time.monotonic() - t0
            assert rc == 0
            print(
                f"\nshard gone {hung_s:.2f} s after the broker hung, {dead_s:.2f} s after it died"
                f" (lease {lease_s:.0f} s); reported when it was back: {failed.message}; the agent stopped"
                f" {stop_s:.1f} s after SIGTERM without a broker"
            )
    finally:
        if broker.pid is not None:
            os.kill(broker.pid, signal.SIGCONT)
        broker.stop()


async def test_a_job_with_a_5000_character_dataset_path_does_not_stop_the_heartbeats(
    bootstrap: str, tmp_path: Path, log_dir: Path
) -> None:
    """Its dataset cannot even be looked at (ENAMETOOLONG): the job's artifact error rides on the heartbeat, the
    node's other artifacts are still reported, and the pool keeps the node ALIVE."""
    await ensure_topics(bootstrap)
    data = tmp_path / "data"
    create_demo_artifacts(data)
    node = "agent-long-path"
    model, long_dataset = "/data/models/gpt2_pretrained", "/data/datasets/" + "d" * (5000 - len("/data/datasets/"))
    args = [
        *("--node-id", node, "--gpus", "A100:1", "--mounts", f"/data={data}", "--log-dir", str(tmp_path / "shards")),
    ]
    with (
        service("shardyard.resource_pool", [], bootstrap=bootstrap, log_dir=log_dir),
        service("shardyard.node_agent", args, bootstrap=bootstrap, log_dir=log_dir),
    ):
        async with Watcher(bootstrap, [HEARTBEATS, NODE_STATE, SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="resource-pool", timeout_s=60)
            await watch.first(ServiceReady, service="node-agent", instance=node, timeout_s=60)
            await watch.first(NodeState, node_id=node, status=NodeStatus.ALIVE, timeout_s=30)

            await send.event(accepted("long-path", model=model, dataset=long_dataset))
            (beat,) = await watch.until(
                lambda: [b for b in watch.of(Heartbeat, node_id=node) if b.artifact_errors][-1:],
                what="a heartbeat with the artifact error",
            )
            assert beat.artifacts == {model: "local"}
            error = beat.artifact_errors[long_dataset]
            assert (error.reason, error.message) == (ArtifactErrorReason.UNREADABLE, "ENAMETOOLONG: File name too long")

            def beats() -> list[Heartbeat | NodeLease]:
                return [b for b in watch.events if isinstance(b, Heartbeat | NodeLease) and b.node_id == node]

            since, seq = time.monotonic(), beat.seq
            await watch.until(lambda: beats()[-1].seq >= seq + 6, timeout_s=30, what="six more beats")
            held_s = time.monotonic() - since
            assert held_s > 5.0
            assert {s.status for s in watch.of(NodeState, node_id=node)} == {NodeStatus.ALIVE}
            print(f"\n{len(beats())} beats from {node}; ALIVE throughout {held_s:.1f} s after the 5,000-char path")
