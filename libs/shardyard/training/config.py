"""Run configuration of one training shard, parsed from the environment the node agent sets."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, TypedDict, TypeVar, cast

from shardyard import errors
from shardyard.training.preemption import RESUME_DIR_ENV

if TYPE_CHECKING:
    from shardyard.events.job import TrainingParams

_T = TypeVar("_T")

DEFAULT_DIST_TIMEOUT_S = 60.0
DEFAULT_CHECKPOINT_EVERY = 1
DEFAULT_SYNC_TIMEOUT_S = 30.0
DEFAULT_SLOW_SYNC_FACTOR = 3.0
DEFAULT_STEP_LOG_EVERY_S = 1.0
CHECKPOINT_EVERY_ENV = "SHARDYARD_CHECKPOINT_EVERY"
SYNC_TIMEOUT_ENV = "SHARDYARD_SYNC_TIMEOUT_S"
SLOW_SYNC_FACTOR_ENV = "SHARDYARD_SLOW_SYNC_FACTOR"
STEP_LOG_EVERY_ENV = "SHARDYARD_STEP_LOG_EVERY_S"
DEVICE_ENV = "SHARDYARD_DEVICE"
PEER_STATE_DIR_ENV = "SHARDYARD_PEER_STATE_DIR"
GLOBAL_BATCH_ENV: Final = "SHARDYARD_GLOBAL_BATCH"
"""Samples per step for the whole gang, kept at every world size an elastic gang is re-formed at (the node agent sets
it from the workload's ``global_batch``). Unset: ``WORLD_SIZE`` x ``SHARDYARD_BATCH_SIZE``."""
AGENT_STORE_ENV: Final = "TORCHELASTIC_USE_AGENT_STORE"
"""``True`` (torch reads exactly that string) when a launcher hosts the gang's store, as torchrun's elastic agent
does and the node agent does for a job's own script (:mod:`shardyard.training.store`): every rank is then a client."""
GRADIENT_CHECKPOINT_STEPS = 100
"""With gradient averaging (``sync_interval`` 1) every step syncs; checkpoints then come every ``checkpoint_every`` x
this many steps, not every ``checkpoint_every`` syncs (a checkpoint a step would cost more than the step)."""
Device = Literal["auto", "cpu", "cuda"]
DEVICES: tuple[Device, ...] = ("auto", "cpu", "cuda")
_MAX_SEED = 2**63 - 1
TRAINING_ENV: Final = {
    "max_steps": "SHARDYARD_MAX_STEPS",
    "batch_size": "SHARDYARD_BATCH_SIZE",
    "seq_len": "SHARDYARD_SEQ_LEN",
    "lr": "SHARDYARD_LR",
    "seed": "SHARDYARD_SEED",
}
"""Where each training parameter (``shardyard.events.job.TrainingParams``) travels to the runner."""


def rank_slice(rank: int, world_size: int, global_batch: int) -> tuple[int, int]:
    """The samples ``[lo, hi)`` of a step's ``global_batch`` that ``rank`` of ``world_size`` trains on: consecutive
    slices, as even as possible (the first ``global_batch % world_size`` ranks take one more). With ``global_batch``
    a multiple of the world size, rank ``r`` takes ``[r * b, (r + 1) * b)``, as a rigid gang of batch ``b`` does."""
    base, extra = divmod(global_batch, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def training_env(training: TrainingParams) -> dict[str, str]:
    """The runner's environment for ``training``: each parameter under its variable, floats exact (``repr``)."""
    return {TRAINING_ENV[name]: repr(value) for name, value in training.model_dump().items()}


class ConfigError(errors.ConfigError, ValueError):
    """The shard's environment is missing a variable or holds a bad value."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid shard configuration: " + "; ".join(self.problems))


@dataclass(frozen=True)
class RunConfig:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    model_dir: Path
    dataset_dir: Path
    output_dir: Path
    sync_interval: int
    max_steps: int
    batch_size: int
    seq_len: int
    lr: float
    seed: int
    progress_fd: int | None = None
    dist_timeout_s: float = DEFAULT_DIST_TIMEOUT_S
    resume_dir: Path | None = None
    """A checkpoint to resume from (``SHARDYARD_RESUME_DIR``): its weights, step and optimizer state."""
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY
    """Rank 0 checkpoints the gang after every this many parameter syncs (``SHARDYARD_CHECKPOINT_EVERY``), or with
    gradient averaging every this many x :data:`GRADIENT_CHECKPOINT_STEPS` steps; 0: never (a preemption still
    checkpoints)."""
    sync_timeout_s: float = DEFAULT_SYNC_TIMEOUT_S
    """The collective timeout of a parameter sync (``SHARDYARD_SYNC_TIMEOUT_S``): past it the shard exits
    SYNC_TIMEOUT. The rendezvous and the barriers keep ``dist_timeout_s``."""
    slow_sync_factor: float = DEFAULT_SLOW_SYNC_FACTOR
    """A sync slower than this many times the median of the previous ones is slow (``SHARDYARD_SLOW_SYNC_FACTOR``)."""
    step_log_every_s: float = DEFAULT_STEP_LOG_EVERY_S
    """The shard's log has a step line at most this often between syncs (``SHARDYARD_STEP_LOG_EVERY_S``); 0: every
    step (``shardyard.training.progress.StepLog``)."""
    device: Device = "auto"
    """Where to train (``SHARDYARD_DEVICE``): ``auto`` is the GPU ``LOCAL_RANK`` names (NCCL) when CUDA is there, else
    the CPU (gloo); ``cpu`` and ``cuda`` insist."""
    peer_state_dir: Path | None = None
    """Where this rank keeps the gang's state of its last sync when it fails, for the re-formed gang to resume from
    (``SHARDYARD_PEER_STATE_DIR``, a directory on the node; see :mod:`shardyard.training.peer_state`); None: off."""
    attempt: int = 0
    """The gang's attempt (``SHARDYARD_ATTEMPT``, set by the agent): it tells the snapshots of one gang from
    another's."""
    global_batch: int | None = None
    """The samples of one step over the whole gang (``SHARDYARD_GLOBAL_BATCH``), kept when an elastic gang is
    re-formed at another world size; None: ``world_size`` x ``batch_size``, a rigid gang's (see :attr:`step_batch`)."""
    agent_store: bool = False
    """Whether a launcher already serves the gang's store on MASTER_ADDR:MASTER_PORT (``TORCHELASTIC_USE_AGENT_STORE``
    exactly ``True``, as torchrun sets it and torch reads it), so that every rank, rank 0 included, is a client of it:
    a rank 0 binding the port itself would find it taken. Our node agent never sets it for the built-in runner, whose
    rank 0 serves the store."""

    @property
    def averages_gradients(self) -> bool:
        """``sync_interval`` 1 is synchronous data parallelism: the gradients are averaged at every step, before the
        optimizer step. Above 1 it is local SGD: the parameters are averaged every ``sync_interval`` steps."""
        return self.sync_interval == 1

    @property
    def checkpoint_steps(self) -> int | None:
        """With gradient averaging, the steps between periodic checkpoints (else None: they count syncs)."""
        if not self.averages_gradients or self.checkpoint_every == 0:
            return None
        return self.checkpoint_every * GRADIENT_CHECKPOINT_STEPS

    @property
    def step_batch(self) -> int:
        """The samples of one step over the whole gang: :attr:`global_batch`, else ``world_size`` x ``batch_size``."""
        return self.world_size * self.batch_size if self.global_batch is None else self.global_batch

    @property
    def batch_slice(self) -> tuple[int, int]:
        """This rank's samples ``[lo, hi)`` of each step's :attr:`step_batch` (:func:`rank_slice`)."""
        return rank_slice(self.rank, self.world_size, self.step_batch)

    @property
    def loss_weight(self) -> float:
        """What this rank's mean loss is scaled by before the backward pass: with gradient averaging, its slice's
        share of the step's batch times the world size, so that the averaged gradient is the gradient of the mean
        loss over the whole batch however unevenly it is sliced (1 for even slices). With local SGD each rank steps
        on its own slice's mean loss: 1."""
        lo, hi = self.batch_slice
        return (hi - lo) * self.world_size / self.step_batch if self.averages_gradients else 1.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RunConfig:
        """Parse the torchrun and ``SHARDYARD_*`` variables; every problem found is listed in one ConfigError."""
        p = _Parser(env)
        rank = p.required("RANK", int, lambda v: v >= 0, "an integer >= 0")
        world_size = p.required("WORLD_SIZE", int, lambda v: v >= 1, "an integer >= 1")
        local_rank = p.required("LOCAL_RANK", int, lambda v: v >= 0, "an integer >= 0")
        master_addr = p.required("MASTER_ADDR", str, lambda v: v != "", "a host name or address")
        master_port = p.required("MASTER_PORT", int, lambda v: 1 <= v <= 65535, "a port number in 1..65535")
        model_dir = p.required("SHARDYARD_MODEL_DIR", str, lambda v: v != "", "a directory path")
        dataset_dir = p.required("SHARDYARD_DATASET_DIR", str, lambda v: v != "", "a directory path")
        output_dir = p.required("SHARDYARD_OUTPUT_DIR", str, lambda v: v != "", "a directory path")
        sync_interval = p.required("SHARDYARD_SYNC_INTERVAL", int, lambda v: v >= 1, "an integer >= 1")
        max_steps = p.required(TRAINING_ENV["max_steps"], int, lambda v: v >= 1, "an integer >= 1")
        batch_size = p.required(TRAINING_ENV["batch_size"], int, lambda v: v >= 1, "an integer >= 1")
        seq_len = p.required(TRAINING_ENV["seq_len"], int, lambda v: v >= 1, "an integer >= 1")
        lr = p.required(TRAINING_ENV["lr"], float, lambda v: math.isfinite(v) and v > 0, "a finite float > 0")
        seed = p.required(TRAINING_ENV["seed"], int, lambda v: 0 <= v <= _MAX_SEED, f"an integer in 0..{_MAX_SEED}")
        progress_fd = p.optional("SHARDYARD_PROGRESS_FD", int, lambda v: v >= 0, "a file descriptor >= 0")
        timeout = p.optional("SHARDYARD_DIST_TIMEOUT_S", float, lambda v: math.isfinite(v) and v > 0, "seconds > 0")
        resume_dir = p.optional(RESUME_DIR_ENV, str, lambda v: v != "", "a directory path")
        tuning = _tuning(p)
        peer_state_dir = p.optional(PEER_STATE_DIR_ENV, str, lambda v: v != "", "a directory path")
        attempt = p.optional("SHARDYARD_ATTEMPT", int, lambda v: v >= 0, "an integer >= 0")
        device = p.optional(DEVICE_ENV, str.lower, lambda v: v in DEVICES, " or ".join(DEVICES))
        global_batch = p.optional(GLOBAL_BATCH_ENV, int, lambda v: v >= 1, "an integer >= 1")
        p.finish(rank, world_size, global_batch)
        # After the checks above every required value is set; the asserts narrow the Optionals for mypy.
        assert rank is not None and world_size is not None and local_rank is not None and master_addr is not None
        assert master_port is not None and model_dir is not None and dataset_dir is not None
        assert output_dir is not None and sync_interval is not None and max_steps is not None
        assert batch_size is not None and seq_len is not None and lr is not None and seed is not None
        return cls(
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            master_addr=master_addr,
            master_port=master_port,
            model_dir=Path(model_dir),
            dataset_dir=Path(dataset_dir),
            output_dir=Path(output_dir),
            sync_interval=sync_interval,
            max_steps=max_steps,
            batch_size=batch_size,
            seq_len=seq_len,
            lr=lr,
            seed=seed,
            progress_fd=progress_fd,
            dist_timeout_s=DEFAULT_DIST_TIMEOUT_S if timeout is None else timeout,
            resume_dir=None if resume_dir is None else Path(resume_dir),
            **tuning,
            device=cast(Device, device or "auto"),
            peer_state_dir=None if peer_state_dir is None else Path(peer_state_dir),
            attempt=attempt or 0,
            global_batch=global_batch,
            agent_store=env.get(AGENT_STORE_ENV) == "True",
        )


class _Tuning(TypedDict):
    """The node's settings of its runners (``RunnerOptions`` of the agent), each with its default."""

    checkpoint_every: int
    sync_timeout_s: float
    slow_sync_factor: float
    step_log_every_s: float


def _tuning(p: _Parser) -> _Tuning:
    checkpoint_every = p.optional(CHECKPOINT_EVERY_ENV, int, lambda v: v >= 0, "an integer >= 0")
    sync_timeout = p.optional(SYNC_TIMEOUT_ENV, float, lambda v: math.isfinite(v) and v > 0, "seconds > 0")
    slow_factor = p.optional(SLOW_SYNC_FACTOR_ENV, float, lambda v: math.isfinite(v) and v > 1, "a float > 1")
    step_log_every = p.optional(STEP_LOG_EVERY_ENV, float, lambda v: math.isfinite(v) and v >= 0, "seconds >= 0")
    return _Tuning(
        checkpoint_every=DEFAULT_CHECKPOINT_EVERY if checkpoint_every is None else checkpoint_every,
        sync_timeout_s=DEFAULT_SYNC_TIMEOUT_S if sync_timeout is None else sync_timeout,
        slow_sync_factor=DEFAULT_SLOW_SYNC_FACTOR if slow_factor is None else slow_factor,
        step_log_every_s=DEFAULT_STEP_LOG_EVERY_S if step_log_every is None else step_log_every,
    )


class _Parser:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.problems: list[str] = []

    def raise_problems(self) -> None:
        """One ConfigError listing every problem found, if there is any."""
        if self.problems:
            raise ConfigError(self.problems)

    def finish(self, rank: int | None, world_size: int | None, global_batch: int | None) -> None:
        """The checks across variables (a rank within the world, at least one sample a rank each step), then one
        ConfigError listing every problem found, if there is any."""
        if world_size is not None and rank is not None and rank >= world_size:
            self.problems.append(f"RANK={rank} must be < WORLD_SIZE={world_size}")
        if world_size is not None and global_batch is not None and global_batch < world_size:
            self.problems.append(f"{GLOBAL_BATCH_ENV}={global_batch} must be >= WORLD_SIZE={world_size}")
        self.raise_problems()

    def required(self, name: str, conv: Callable[[str], _T], ok: Callable[[_T], bool], what: str) -> _T | None:
        if name not in self.env:
            self.problems.append(f"{name} is not set (expected {what})")
            return None
        return self._convert(name, conv, ok, what)

    def optional(self, name: str, conv: Callable[[str], _T], ok: Callable[[_T], bool], what: str) -> _T | None:
        if self.env.get(name, "").strip() == "":
            return None
        return self._convert(name, conv, ok, what)

    def _convert(self, name: str, conv: Callable[[str], _T], ok: Callable[[_T], bool], what: str) -> _T | None:
        raw = self.env[name]
        try:
            value = conv(raw.strip())
        except ValueError:
            self.problems.append(f"{name}={raw!r} is not {what}")
            return None
        if not ok(value):
            self.problems.append(f"{name}={raw!r} is not {what}")
            return None
        return value
