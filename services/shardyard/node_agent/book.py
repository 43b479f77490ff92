"""The agent's decisions, pure: which assignments to run, hold (spares) and stop, which shards a lost lease fences,
the command and environment a shard gets (the built-in runner, or the job's own entrypoint under the supervisor of
:mod:`shardyard.training.entry`), what its reports mean (checkpointed) and what its end means (completed, failed with
a cause, or preempted with a checkpoint)."""

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path

from shardyard.events import (
    Event,
    FailureCause,
    RunningShard,
    ShardAssignment,
    ShardCheckpointed,
    ShardCompleted,
    ShardFailed,
    ShardPreempted,
    ShardRevocation,
    ShardStopRequest,
)
from shardyard.node_agent.mounts import resolve
from shardyard.node_agent.redaction import redact, secrets_of
from shardyard.training import entry, store
from shardyard.training.config import (
    CHECKPOINT_EVERY_ENV,
    DEFAULT_CHECKPOINT_EVERY,
    DEFAULT_SLOW_SYNC_FACTOR,
    DEFAULT_SYNC_TIMEOUT_S,
    PEER_STATE_DIR_ENV,
    SLOW_SYNC_FACTOR_ENV,
    SYNC_TIMEOUT_ENV,
)
from shardyard.training.exitcodes import ExitCause, classify_exit
from shardyard.training.lease import DEFAULT_SHARD_LEASE_S, LEASE_FILE_ENV, LEASE_S_ENV
from shardyard.training.preemption import CHECKPOINT_SUBDIR, RESUME_DIR_ENV, checkpoint_job_path

ShardKey = tuple[str, int, int]
"""(job id, shard index, attempt): a shard attempt runs at most once."""

PROGRESS_FD_ENV = entry.PROGRESS_FD_ENV
RUNNER_MODULE = "shardyard.training.shard"
ENTRY_DEFAULTS = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
"""What an entrypoint's environment holds unless the job's ``env`` says otherwise (the built-in runner's threads;
print() lines reach the shard log as they are written, not when a buffer fills)."""

_CAUSE = {
    ExitCause.USER_ERROR: FailureCause.USER_ERROR,
    ExitCause.COMM_ERROR: FailureCause.COMM_ERROR,
    ExitCause.KILLED: FailureCause.KILLED,
    ExitCause.PROCESS_EXIT: FailureCause.PROCESS_EXIT,
    ExitCause.OOM: FailureCause.OOM,
    ExitCause.GPU_FAULT: FailureCause.GPU_FAULT,
    ExitCause.SYNC_TIMEOUT: FailureCause.SYNC_TIMEOUT,
    ExitCause.FENCED: FailureCause.FENCED,
}


class Verdict(StrEnum):
    LAUNCH = "LAUNCH"
    HOLD_SPARE = "HOLD_SPARE"
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
    workdir: Path | None = None
    """An entrypoint's ``working_dir`` on this node; None: the agent's working directory."""

    def missing(self) -> list[str]:
        inputs = [("model", self.model), ("dataset", self.dataset)]
        if self.resume is not None:
            inputs.append(("checkpoint", self.resume))
        return [f"{name} {path}" for name, path in inputs if not path.is_dir()]


@dataclass(frozen=True)
class RunnerOptions:
    """The node's settings for the runners it starts (``SHARDYARD_*`` variables of every shard)."""

    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY
    sync_timeout_s: float = DEFAULT_SYNC_TIMEOUT_S
    slow_sync_factor: float = DEFAULT_SLOW_SYNC_FACTOR
    peer_state_dir: str | None = None
    """Where the node's shards keep their gang's state when they fail, one directory per job (None: they keep
    none); see :mod:`shardyard.training.peer_state`."""
    lease_file: str | None = None
    """The file the agent touches on every heartbeat the bus acknowledged; shards fence themselves on its age."""
    shard_lease_s: float = DEFAULT_SHARD_LEASE_S
    socket_ifname: str | None = None
    """The network interface of the node's advertised address: gloo and NCCL listen there, not on whichever
    interface the host name leads to (None: their own choice). The agent's environment, or the job's, may name
    another."""

    def env(self) -> dict[str, str]:
        lease = {LEASE_FILE_ENV: self.lease_file, LEASE_S_ENV: repr(self.shard_lease_s)} if self.lease_file else {}
        return {
            CHECKPOINT_EVERY_ENV: str(self.checkpoint_every),
            SYNC_TIMEOUT_ENV: repr(self.sync_timeout_s),
            SLOW_SYNC_FACTOR_ENV: repr(self.slow_sync_factor),
            **lease,
        }

    def net_env(self) -> dict[str, str]:
        if self.socket_ifname is None:
            return {}
        return {"GLOO_SOCKET_IFNAME": self.socket_ifname, "NCCL_SOCKET_IFNAME": f"={self.socket_ifname}"}


@dataclass
class AgentBook:
    node_id: str
    max_term: int = 0
    seen: set[ShardKey] = field(default_factory=set)
    running: dict[ShardKey, ShardAssignment] = field(default_factory=dict)
    spares: dict[ShardKey, ShardAssignment] = field(default_factory=dict)
    """GPUs held in reserve for a gang: recorded, no process, not running (not in heartbeats' ``running``)."""
    revoked: set[ShardKey] = field(default_factory=set)
    stopping: set[ShardKey] = field(default_factory=set)
    fenced: dict[ShardKey, str] = field(default_factory=dict)
    """Shards stopped because the agent lost the bus (self-fencing), with the message their end is reported with."""
    gpu_faulted: dict[ShardKey, str] = field(default_factory=dict)
    """Shards stopped because a GPU of theirs faulted, with the message their end is reported with (GPU_FAULT)."""
    utilization: dict[ShardKey, float] = field(default_factory=dict)
    """Cores each running shard uses (its last progress report's ``cpu_percent`` / 100)."""
    sync_intervals: dict[ShardKey, int] = field(default_factory=dict)
    """Each running shard's sync interval as its last progress report gave it."""

    def on_assignment(self, assignment: ShardAssignment) -> Verdict:
        """What to do with an assignment. A (job, shard, attempt) is launched at most once; a spare is only held.
        A spare whose own assignment comes again without ``spare`` is launched in place: it never ran."""
        if assignment.node_id != self.node_id:
            return Verdict.NOT_MINE
        if assignment.term < self.max_term:
            return Verdict.STALE_TERM
        self.max_term = assignment.term
        key = key_of(assignment)
        promoted = key in self.spares and not assignment.spare
        if key in self.seen and not promoted:
            return Verdict.DUPLICATE
        self.seen.add(key)
        if assignment.spare:
            self.spares[key] = assignment
            return Verdict.HOLD_SPARE
        self.spares.pop(key, None)
        self.running[key] = assignment
        return Verdict.LAUNCH

    def on_revocation(self, revocation: ShardRevocation) -> ShardKey | None:
        """The running shard to stop, if the revocation is for one of ours and not from an older term. A revoked
        spare is just dropped (nothing runs)."""
        key = key_of(revocation)
        if revocation.node_id != self.node_id or revocation.term < self.max_term:
            return None
        if self.spares.pop(key, None) is not None or key not in self.running:
            return None
        self.revoked.add(key)
        return key

    def fence(self, message: str) -> list[ShardKey]:
        """The agent lost the bus: every running shard not fenced yet is to be stopped; its end will be reported
        as REVOKED with ``message``. Spares run nothing and stay recorded."""
        keys = [key for key in sorted(self.running) if key not in self.fenced]
        for key in keys:
            self.fenced[key] = message
        return keys

    def gpu_fault(self, faults: Mapping[int, str], started: Collection[ShardKey]) -> list[ShardKey]:
        """GPUs that faulted (index -> fault): every started shard on one, not stopped for it yet, is to be stopped;
        its end will be reported as GPU_FAULT. A shard still being launched is left to the next call (heartbeat)."""
        keys = []
        for key in sorted(self.running):
            bad = [f"GPU {gpu}: {faults[gpu]}" for gpu in self.running[key].gpu_indices if gpu in faults]
            if bad and key in started and key not in self.gpu_faulted:
                self.gpu_faulted[key] = "; ".join(bad)
                keys.append(key)
        return keys

    def checkpointed(self, key: ShardKey, report: Mapping[str, object], *, now: datetime) -> ShardCheckpointed | None:
        """A running shard's ``checkpointed`` report as an event naming the checkpoint by its job path; None when the
        report is malformed or the shard is not running."""
        assignment = self.running.get(key)
        step = report.get("step")
        if assignment is None or not isinstance(step, int) or isinstance(step, bool) or step < 0:
            return None
        job_id, shard_index, attempt = key
        return ShardCheckpointed(
            occurred_at=now,
            job_id=job_id,
            shard_index=shard_index,
            attempt=attempt,
            node_id=self.node_id,
            step=step,
            checkpoint_dir=checkpoint_job_path(assignment.workload.output_path),
        )

    def pace(self, key: ShardKey, report: Mapping[str, object]) -> tuple[int, int] | None:
        """(old, new) when a progress report gives a sync interval other than the shard's previous one."""
        interval = report.get("sync_interval")
        if not isinstance(interval, int) or isinstance(interval, bool):
            return None
        previous = self.sync_intervals.get(key)
        self.sync_intervals[key] = interval
        return None if previous is None or previous == interval else (previous, interval)

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
            workdir=None
            if workload.entrypoint is None or workload.entrypoint.working_dir is None
            else resolve(workload.entrypoint.working_dir, mounts),
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
        self.sync_intervals.pop(key, None)
        self.stopping.discard(key)
        fenced = self.fenced.pop(key, None)
        gpu_fault = self.gpu_faulted.pop(key, None)
        if key in self.revoked:
            self.revoked.discard(key)
            return None
        job_id, shard_index, attempt = key
        entrypoint = assignment.workload.entrypoint
        message = message if entrypoint is None else redact(message, secrets_of(entrypoint.env))
        info = final or {}
        if cause is None and returncode is not None:
            exit_cause = classify_exit(returncode)
            if fenced is not None and exit_cause not in (ExitCause.OK, ExitCause.PREEMPTED):
                cause, message = FailureCause.FENCED, fenced  # whatever it died of, we stopped it
            if gpu_fault is not None and exit_cause not in (ExitCause.OK, ExitCause.PREEMPTED):
                cause, message = FailureCause.GPU_FAULT, gpu_fault  # the hardware's fault, whoever stopped it
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
            cause = cause or _CAUSE[exit_cause]
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


def shard_argv(assignment: ShardAssignment, paths: ShardPaths, *, python: str) -> tuple[str, ...]:
    """What a shard runs: the built-in runner, or the job's own command (verbatim, no shell) under the supervisor."""
    entrypoint = assignment.workload.entrypoint
    if entrypoint is None:
        return (python, "-m", RUNNER_MODULE)
    cwd = () if paths.workdir is None else ("--cwd", str(paths.workdir))
    return (python, "-m", entry.MODULE, *cwd, "--", *entrypoint.command)


def shard_env(
    assignment: ShardAssignment,
    paths: ShardPaths,
    *,
    base_env: Mapping[str, str],
    options: RunnerOptions = RunnerOptions(),
    local_world_size: int = 1,
    home: Path | None = None,
) -> dict[str, str]:
    """The torchrun-compatible environment of one shard, plus the runner's ``SHARDYARD_*`` inputs.

    Every GPU of the node stays visible and LOCAL_RANK is the shard's GPU index, so a script that does
    ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` (as torchrun scripts do) lands on its assigned GPU.

    An entrypoint's environment is the interface gloo and NCCL listen on (``options.net_env()``), the agent's,
    ``home`` as HOME and TMPDIR (a shard under a user of its own cannot write the agent's), then
    :data:`ENTRY_DEFAULTS`, then the job's ``env``, then the runtime's variables, which nothing overrides: these,
    ``LOCAL_WORLD_SIZE`` (``local_world_size``, the node's GPU count, so that LOCAL_RANK < LOCAL_WORLD_SIZE),
    ``SHARDYARD_CHECKPOINT_DIR`` (``<output>/checkpoint``) and, for a gang, the hosted store's (:func:`hosted_store`).
    """
    workload = assignment.workload
    local_rank = assignment.gpu_indices[0] if assignment.gpu_indices else 0
    base = {**options.net_env(), **base_env, **private_home(home)}
    if workload.entrypoint is None:
        first: dict[str, str] = {**base, "OMP_NUM_THREADS": "1"}
        last: dict[str, str] = {}
    else:
        first = {**base, **ENTRY_DEFAULTS, **workload.entrypoint.env}
        last = {
            "LOCAL_WORLD_SIZE": str(max(local_world_size, local_rank + 1)),
            entry.CHECKPOINT_DIR_ENV: str(paths.output / CHECKPOINT_SUBDIR),
            **hosted_store(assignment),
        }
    return (
        {
            **first,
            "RANK": str(assignment.shard_index),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(assignment.world_size),
            "MASTER_ADDR": assignment.master_addr,
            "MASTER_PORT": str(assignment.master_port),
            "SHARDYARD_JOB_ID": assignment.job_id,
            "SHARDYARD_ATTEMPT": str(assignment.attempt),
            "SHARDYARD_MODEL_DIR": str(paths.model),
            "SHARDYARD_DATASET_DIR": str(paths.dataset),
            "SHARDYARD_OUTPUT_DIR": str(paths.output),
            entry.SYNC_INTERVAL_ENV: str(workload.sync_interval),
            "SHARDYARD_MAX_STEPS": str(workload.max_steps),
            "SHARDYARD_BATCH_SIZE": str(workload.batch_size),
            "SHARDYARD_SEQ_LEN": str(workload.seq_len),
            "SHARDYARD_LR": repr(workload.lr),
            "SHARDYARD_SEED": str(workload.seed),
            **options.env(),
            **last,
        }
        | ({RESUME_DIR_ENV: str(paths.resume)} if paths.resume is not None else {})
        | peer_state_env(assignment, options)
    )


def hosted_store(assignment: ShardAssignment) -> dict[str, str]:
    """A gang of a job's own script rendezvous at a store the runtime hosts on MASTER_ADDR (rank 0's supervisor:
    :mod:`shardyard.training.store`), every rank a client of it, as under torchrun; a script's own store would
    listen on every interface. A single shard has no gang: its script is left to itself."""
    if assignment.world_size < 2:
        return {}
    return {store.AGENT_STORE_ENV: "True", store.RESTART_COUNT_ENV: str(max(0, assignment.attempt - 1))}


def private_home(home: Path | None) -> dict[str, str]:
    """HOME and TMPDIR of a shard that has a private directory of its own (None: the agent's stay)."""
    return {} if home is None else {"HOME": str(home), "TMPDIR": str(home)}


def peer_state_dir(options: RunnerOptions, job_id: str) -> Path | None:
    """The directory where the built-in runner's shards of ``job_id`` keep their gang's state on this node."""
    return None if options.peer_state_dir is None else Path(options.peer_state_dir) / job_id


def peer_state_env(assignment: ShardAssignment, options: RunnerOptions) -> dict[str, str]:
    where = peer_state_dir(options, assignment.job_id)
    if where is None or assignment.workload.entrypoint is not None:  # a job's own script keeps its own state
        return {}
    return {PEER_STATE_DIR_ENV: str(where)}
