"""What a shard runs on this node and the environment it gets: the built-in runner, or the job's own entrypoint under
the supervisor of :mod:`shardyard.training.entry`, with torchrun's variables and the runner's ``SHARDYARD_*`` inputs,
the notice of a preemption among them (its signal and seconds: :func:`~shardyard.training.preemption.notice_env`).
Where its inputs are on this disk comes from the node's mounts. Pure, but for :meth:`ShardPaths.missing`, which looks
at the disk."""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from shardyard.cluster_secret import SECRET_ENV
from shardyard.events import ShardAssignment
from shardyard.node_agent.mounts import resolve
from shardyard.secret_env import decrypt_all
from shardyard.training import entry, store
from shardyard.training.config import (
    CHECKPOINT_EVERY_ENV,
    DEFAULT_CHECKPOINT_EVERY,
    DEFAULT_SLOW_SYNC_FACTOR,
    DEFAULT_STEP_LOG_EVERY_S,
    DEFAULT_SYNC_TIMEOUT_S,
    GLOBAL_BATCH_ENV,
    PEER_STATE_DIR_ENV,
    SLOW_SYNC_FACTOR_ENV,
    STEP_LOG_EVERY_ENV,
    SYNC_TIMEOUT_ENV,
    training_env,
)
from shardyard.training.lease import DEFAULT_SHARD_LEASE_S, LEASE_FILE_ENV, LEASE_S_ENV
from shardyard.training.preemption import CHECKPOINT_SUBDIR, RESUME_DIR_ENV, notice_env
from shardyard.training.slowdown import SLOWDOWN_DIR_ENV

PROGRESS_FD_ENV = entry.PROGRESS_FD_ENV
RUNNER_MODULE = "shardyard.training.shard"
ENTRY_DEFAULTS = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
"""What an entrypoint's environment holds unless the job's ``env`` says otherwise (the built-in runner's threads;
print() lines reach the shard log as they are written, not when a buffer fills)."""


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


class RunnerSettings(BaseModel):
    """The agent's settings of the built-in runners it starts (part of its own, ``AgentSettings``)."""

    checkpoint_every: int = Field(
        default=DEFAULT_CHECKPOINT_EVERY, ge=0, description="shards checkpoint after every N parameter syncs; 0: never"
    )
    sync_timeout_s: float = Field(
        default=DEFAULT_SYNC_TIMEOUT_S, gt=0, description="a parameter sync that takes longer fails the shard"
    )
    slow_sync_factor: float = Field(
        default=DEFAULT_SLOW_SYNC_FACTOR, gt=1, description="a sync this many times the median is slow"
    )
    step_log_every_s: float = Field(
        default=DEFAULT_STEP_LOG_EVERY_S, ge=0, description="a step line in a shard's log at most this often (0: each)"
    )


@dataclass(frozen=True)
class RunnerOptions:
    """The node's settings for the runners it starts (``SHARDYARD_*`` variables of every shard)."""

    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY
    sync_timeout_s: float = DEFAULT_SYNC_TIMEOUT_S
    slow_sync_factor: float = DEFAULT_SLOW_SYNC_FACTOR
    step_log_every_s: float = DEFAULT_STEP_LOG_EVERY_S
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
            STEP_LOG_EVERY_ENV: repr(self.step_log_every_s),
            **lease,
        }

    def net_env(self) -> dict[str, str]:
        if self.socket_ifname is None:
            return {}
        return {"GLOO_SOCKET_IFNAME": self.socket_ifname, "NCCL_SOCKET_IFNAME": f"={self.socket_ifname}"}


def shard_paths(assignment: ShardAssignment, mounts: Mapping[str, str]) -> ShardPaths:
    """The job paths of the assignment on this node's disk, through its mounts."""
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
    user_name: str | None = None,
) -> dict[str, str]:
    """The torchrun-compatible environment of one shard, plus the runner's ``SHARDYARD_*`` inputs.

    Every GPU of the node stays visible and LOCAL_RANK is the shard's GPU index, so a script that does
    ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` (as torchrun scripts do) lands on its assigned GPU.

    An entrypoint's environment is the interface gloo and NCCL listen on (``options.net_env()``), the agent's,
    ``home`` as HOME and TMPDIR (a shard under a user of its own cannot write the agent's) and ``user_name`` as USER
    and LOGNAME (that user's, not the agent's: a per-job uid has no passwd entry, and ``getpass.getuser()``, which
    torch calls on CUDA to name its caches, reads these before it asks the user database), then
    :data:`ENTRY_DEFAULTS`, then the job's ``env``, then the runtime's variables, which nothing overrides: these,
    ``LOCAL_WORLD_SIZE`` (``local_world_size``, the node's GPU count, so that LOCAL_RANK < LOCAL_WORLD_SIZE),
    ``SHARDYARD_CHECKPOINT_DIR`` (``<output>/checkpoint``) and, for a gang, the hosted store's (:func:`hosted_store`).
    """
    workload = assignment.workload
    local_rank = assignment.gpu_indices[0] if assignment.gpu_indices else 0
    base = {**options.net_env(), **base_env, **private_home(home), **login_names(user_name)}
    if workload.entrypoint is None:
        first: dict[str, str] = {**runner_base(base), "OMP_NUM_THREADS": "1"}
        last: dict[str, str] = {}
    else:
        first = {**base, **ENTRY_DEFAULTS, **workload.entrypoint.env}
        last = {
            "LOCAL_WORLD_SIZE": str(max(local_world_size, local_rank + 1)),
            entry.CHECKPOINT_DIR_ENV: str(paths.output / CHECKPOINT_SUBDIR),
            **hosted_store(assignment),
        }
    env = (
        {
            **first,
            "RANK": str(assignment.shard_index),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(assignment.world_size),
            "MASTER_ADDR": assignment.master_addr,
            "MASTER_PORT": str(assignment.master_port),
            **{"SHARDYARD_JOB_ID": assignment.job_id, "SHARDYARD_NODE_ID": assignment.node_id},
            "SHARDYARD_ATTEMPT": str(assignment.attempt),
            "SHARDYARD_MODEL_DIR": str(paths.model),
            "SHARDYARD_DATASET_DIR": str(paths.dataset),
            "SHARDYARD_OUTPUT_DIR": str(paths.output),
            entry.SYNC_INTERVAL_ENV: str(workload.sync_interval),
            **training_env(workload.training),
            **options.env(),
            **notice_env(assignment.notice_s),
            **last,
        }
        | continuation_env(assignment, paths)
        | peer_state_env(assignment, options)
    )
    env.pop(SECRET_ENV, None)  # the cluster secret is the agent's, never the job's
    return env


def continuation_env(assignment: ShardAssignment, paths: ShardPaths) -> dict[str, str]:
    """What carries a job over from its attempt before: the checkpoint it resumes from, and an elastic job's global
    batch (the same at every world size it is re-formed at)."""
    global_batch = assignment.workload.global_batch
    resume = {} if paths.resume is None else {RESUME_DIR_ENV: str(paths.resume)}
    return resume | ({} if global_batch is None else {GLOBAL_BATCH_ENV: str(global_batch)})


def hosted_store(assignment: ShardAssignment) -> dict[str, str]:
    """A gang of a job's own script rendezvous at a store the runtime hosts on MASTER_ADDR (rank 0's supervisor:
    :mod:`shardyard.training.store`), every rank a client of it, as under torchrun; a script's own store would
    listen on every interface. A single shard has no gang: its script is left to itself."""
    if assignment.world_size < 2:
        return {}
    return {store.AGENT_STORE_ENV: "True", store.RESTART_COUNT_ENV: str(max(0, assignment.attempt - 1))}


def agent_base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment as its shards start from: its own settings (``SHARDYARD_*``) stay its own, but for the
    test-only slow-down hook (``shardyard.training.slowdown``), which is meant for the shards."""
    return {k: v for k, v in environ.items() if not k.startswith("SHARDYARD_") or k == SLOWDOWN_DIR_ENV}


def runner_base(base: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment as the built-in runner gets it: without ``TORCHELASTIC_USE_AGENT_STORE``. The runner's
    rank 0 serves its gang's store; told that a launcher does (an agent started under torchrun would pass the variable
    on), it would wait as a client of a store that nobody serves."""
    return {name: value for name, value in base.items() if name != store.AGENT_STORE_ENV}


def private_home(home: Path | None) -> dict[str, str]:
    """HOME and TMPDIR of a shard that has a private directory of its own (None: the agent's stay)."""
    return {} if home is None else {"HOME": str(home), "TMPDIR": str(home)}


def login_names(user_name: str | None) -> dict[str, str]:
    """USER and LOGNAME of a shard under a user of its own (None: the agent's stay)."""
    return {} if user_name is None else {"USER": user_name, "LOGNAME": user_name}


def peer_state_dir(options: RunnerOptions, job_id: str) -> Path | None:
    """The directory where the built-in runner's shards of ``job_id`` keep their gang's state on this node."""
    return None if options.peer_state_dir is None else Path(options.peer_state_dir) / job_id


def peer_state_env(assignment: ShardAssignment, options: RunnerOptions) -> dict[str, str]:
    where = peer_state_dir(options, assignment.job_id)
    if where is None or assignment.workload.entrypoint is not None:  # a job's own script keeps its own state
        return {}
    return {PEER_STATE_DIR_ENV: str(where)}


def opened_env(assignment: ShardAssignment, key: bytes | None) -> ShardAssignment:
    """``assignment`` with its entrypoint's environment values decrypted (``shardyard.secret_env``), for the shard's
    environment only; raises :class:`SecretEnvError` for one that cannot be."""
    entrypoint = assignment.workload.entrypoint
    if entrypoint is None or not entrypoint.env:
        return assignment
    env = decrypt_all(entrypoint.env, key, assignment.job_id)
    workload = assignment.workload.model_copy(update={"entrypoint": entrypoint.model_copy(update={"env": env})})
    return assignment.model_copy(update={"workload": workload})
