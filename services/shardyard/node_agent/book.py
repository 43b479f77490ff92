"""The agent's decisions, pure: which assignments to run and which shards to stop, the environment a shard gets,
and what its end means (completed, failed, or preempted with a checkpoint)."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path

from shardyard.events import (
    Event,
    FailureCause,
    RunningShard,
    ShardAssignment,
    ShardCompleted,
    ShardFailed,
    ShardPreempted,
    ShardRevocation,
    ShardStopRequest,
)
from shardyard.node_agent.mounts import resolve
from shardyard.training.exitcodes import ExitCause, classify_exit
from shardyard.training.preemption import RESUME_DIR_ENV, checkpoint_job_path

ShardKey = tuple[str, int, int]
"""(job id, shard index, attempt): a shard attempt runs at most once."""

PROGRESS_FD_ENV = "SHARDYARD_PROGRESS_FD"

_CAUSE = {
    ExitCause.USER_ERROR: FailureCause.USER_ERROR,
    ExitCause.COMM_ERROR: FailureCause.COMM_ERROR,
    ExitCause.KILLED: FailureCause.KILLED,
    ExitCause.PROCESS_EXIT: FailureCause.PROCESS_EXIT,
}


class Verdict(StrEnum):
    LAUNCH = "LAUNCH"
    NOT_MINE = "NOT_MINE"
    DUPLICATE = "DUPLICATE"
    STALE_TERM = "STALE_TERM"


def key_of(event: ShardAssignment | ShardRevocation | ShardStopRequest) -> ShardKey:
    return (event.job_id, event.shard_index, event.attempt)


@dataclass(frozen=True)
class ShardPaths:
    model: Path
    dataset: Path
    output: Path
    resume: Path | None = None

    def missing(self) -> list[str]:
        inputs = [("model", self.model), ("dataset", self.dataset)]
        if self.resume is not None:
            inputs.append(("checkpoint", self.resume))
        return [f"{name} {path}" for name, path in inputs if not path.is_dir()]


@dataclass
class AgentBook:
    node_id: str
    max_term: int = 0
    seen: set[ShardKey] = field(default_factory=set)
    running: dict[ShardKey, ShardAssignment] = field(default_factory=dict)
    revoked: set[ShardKey] = field(default_factory=set)
    stopping: set[ShardKey] = field(default_factory=set)
    utilization: dict[ShardKey, float] = field(default_factory=dict)
    """Cores each running shard uses (its last progress report's ``cpu_percent`` / 100)."""

    def on_assignment(self, assignment: ShardAssignment) -> Verdict:
        if assignment.node_id != self.node_id:
            return Verdict.NOT_MINE
        if assignment.term < self.max_term:
            return Verdict.STALE_TERM
        self.max_term = assignment.term
        key = key_of(assignment)
        if key in self.seen:
            return Verdict.DUPLICATE
        self.seen.add(key)
        self.running[key] = assignment
        return Verdict.LAUNCH

    def on_revocation(self, revocation: ShardRevocation) -> ShardKey | None:
        """The running shard to stop, if the revocation is for one of ours and not from an older term."""
        key = key_of(revocation)
        if revocation.node_id != self.node_id or revocation.term < self.max_term or key not in self.running:
            return None
        self.revoked.add(key)
        return key

    def on_stop_request(self, request: ShardStopRequest) -> ShardKey | None:
        """The running shard to signal, if the request is for one of ours, not from an older term, and new."""
        key = key_of(request)
        if request.node_id != self.node_id or request.term < self.max_term or key not in self.running:
            return None
        if key in self.revoked or key in self.stopping:
            return None  # being stopped already: a redelivered request changes nothing
        self.stopping.add(key)
        return key

    def gpu_utilization(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for key, assignment in self.running.items():
            for gpu in assignment.gpu_indices:
                out[gpu] = max(out.get(gpu, 0.0), self.utilization.get(key, 0.01))
        return out

    def running_shards(self, pids: Mapping[ShardKey, int]) -> tuple[RunningShard, ...]:
        return tuple(
            RunningShard(job_id=job, shard_index=shard, attempt=attempt, pid=pids.get((job, shard, attempt)))
            for job, shard, attempt in sorted(self.running)
        )

    def paths(self, assignment: ShardAssignment, mounts: Mapping[str, str]) -> ShardPaths:
        workload = assignment.workload
        return ShardPaths(
            model=resolve(workload.model_path, mounts),
            dataset=resolve(workload.dataset_path, mounts),
            output=resolve(workload.output_path, mounts),
            resume=None if workload.resume_from is None else resolve(workload.resume_from, mounts),
        )

    def finished(
        self,
        key: ShardKey,
        returncode: int | None,
        *,
        now: datetime,
        final: Mapping[str, object] | None,
        message: str,
        cause: FailureCause | None = None,
    ) -> Event | None:
        """The event that reports a shard's end; None when it was revoked (its job already ended).

        ``final`` is the shard's last report: ``finished`` (after a normal end) or ``preempted`` (after a stop).
        """
        assignment = self.running.pop(key)
        self.utilization.pop(key, None)
        self.stopping.discard(key)
        if key in self.revoked:
            self.revoked.discard(key)
            return None
        job_id, shard_index, attempt = key
        info = final or {}
        if cause is None and returncode is not None:
            exit_cause = classify_exit(returncode)
            if exit_cause is ExitCause.OK:
                loss = info.get("final_loss")
                steps = info.get("steps")
                return ShardCompleted(
                    occurred_at=now,
                    job_id=job_id,
                    shard_index=shard_index,
                    attempt=attempt,
                    node_id=self.node_id,
                    final_loss=float(loss) if isinstance(loss, int | float) else None,
                    steps=int(steps) if isinstance(steps, int) else None,
                    checkpoint_dir=assignment.workload.output_path,
                )
            if exit_cause is ExitCause.PREEMPTED:
                # The runner exits PREEMPTED only once rank 0's checkpoint is complete, report or not.
                step = info.get("step") if info.get("kind") == "preempted" else None
                return ShardPreempted(
                    occurred_at=now,
                    job_id=job_id,
                    shard_index=shard_index,
                    attempt=attempt,
                    node_id=self.node_id,
                    step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                    checkpoint_dir=checkpoint_job_path(assignment.workload.output_path),
                )
            cause = _CAUSE[exit_cause]
        return ShardFailed(
            occurred_at=now,
            job_id=job_id,
            shard_index=shard_index,
            attempt=attempt,
            node_id=self.node_id,
            cause=cause or FailureCause.PROCESS_EXIT,
            exit_code=returncode,
            message=message,
        )


def shard_env(assignment: ShardAssignment, paths: ShardPaths, *, base_env: Mapping[str, str]) -> dict[str, str]:
    """The torchrun-compatible environment of one shard, plus the runner's ``SHARDYARD_*`` inputs.

    Every GPU of the node stays visible and LOCAL_RANK is the shard's GPU index, so a script that does
    ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` (as torchrun scripts do) lands on its assigned GPU.
    """
    workload = assignment.workload
    return {
        **base_env,
        "RANK": str(assignment.shard_index),
        "LOCAL_RANK": str(assignment.gpu_indices[0] if assignment.gpu_indices else 0),
        "WORLD_SIZE": str(assignment.world_size),
        "MASTER_ADDR": assignment.master_addr,
        "MASTER_PORT": str(assignment.master_port),
        "OMP_NUM_THREADS": "1",
        "SHARDYARD_JOB_ID": assignment.job_id,
        "SHARDYARD_ATTEMPT": str(assignment.attempt),
        "SHARDYARD_MODEL_DIR": str(paths.model),
        "SHARDYARD_DATASET_DIR": str(paths.dataset),
        "SHARDYARD_OUTPUT_DIR": str(paths.output),
        "SHARDYARD_SYNC_INTERVAL": str(workload.sync_interval),
        "SHARDYARD_MAX_STEPS": str(workload.max_steps),
        "SHARDYARD_BATCH_SIZE": str(workload.batch_size),
        "SHARDYARD_SEQ_LEN": str(workload.seq_len),
        "SHARDYARD_LR": repr(workload.lr),
        "SHARDYARD_SEED": str(workload.seed),
    } | ({RESUME_DIR_ENV: str(paths.resume)} if paths.resume is not None else {})
