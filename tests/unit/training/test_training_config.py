from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from shardyard.events.job import Entrypoint
from shardyard.node_agent.environment import ShardPaths, shard_env
from shardyard.training import exitcodes, runner
from shardyard.training.config import (
    DEFAULT_DIST_TIMEOUT_S,
    GLOBAL_BATCH_ENV,
    GRADIENT_CHECKPOINT_STEPS,
    ConfigError,
    RunConfig,
)
from shardyard.training.errors import DeviceError
from shardyard.training.preemption import StopFlag
from shardyard.training.progress import ProgressReporter
from shardyard.training.rendezvous import Placement, choose_placement
from shardyard.training.runner import CommError, SyncTimeoutError, main
from tests.unit.builders import assignment, workload

GOOD_ENV: dict[str, str] = {
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "SHARDYARD_MODEL_DIR": "/data/models/gpt2",
    "SHARDYARD_DATASET_DIR": "/data/datasets/wikitext",
    "SHARDYARD_OUTPUT_DIR": "/out/ckpt",
    "SHARDYARD_SYNC_INTERVAL": "100",
    "SHARDYARD_MAX_STEPS": "300",
    "SHARDYARD_BATCH_SIZE": "8",
    "SHARDYARD_SEQ_LEN": "64",
    "SHARDYARD_LR": "3e-4",
    "SHARDYARD_SEED": "7",
}
OPTIONAL = {
    "SHARDYARD_PROGRESS_FD",
    "SHARDYARD_DIST_TIMEOUT_S",
    "SHARDYARD_RESUME_DIR",
    "SHARDYARD_CHECKPOINT_EVERY",
    "SHARDYARD_SYNC_TIMEOUT_S",
    "SHARDYARD_SLOW_SYNC_FACTOR",
    "SHARDYARD_DEVICE",
    "SHARDYARD_GLOBAL_BATCH",
}


def test_parses_a_complete_environment() -> None:
    cfg = RunConfig.from_env({**GOOD_ENV, "SHARDYARD_PROGRESS_FD": "9", "SHARDYARD_DIST_TIMEOUT_S": "2.5"})
    assert cfg == RunConfig(
        rank=1,
        world_size=2,
        local_rank=0,
        master_addr="127.0.0.1",
        master_port=29500,
        model_dir=Path("/data/models/gpt2"),
        dataset_dir=Path("/data/datasets/wikitext"),
        output_dir=Path("/out/ckpt"),
        sync_interval=100,
        max_steps=300,
        batch_size=8,
        seq_len=64,
        lr=3e-4,
        seed=7,
        progress_fd=9,
        dist_timeout_s=2.5,
    )


def test_optional_values_take_defaults() -> None:
    cfg = RunConfig.from_env(GOOD_ENV)
    assert cfg.progress_fd is None
    assert cfg.dist_timeout_s == DEFAULT_DIST_TIMEOUT_S == 60.0
    assert cfg.resume_dir is None
    assert (cfg.checkpoint_every, cfg.sync_timeout_s, cfg.slow_sync_factor) == (1, 30.0, 3.0)
    assert cfg.device == "auto"


@pytest.mark.parametrize(("value", "device"), [("cpu", "cpu"), (" CUDA ", "cuda"), ("auto", "auto"), ("", "auto")])
def test_device(value: str, device: str) -> None:
    assert RunConfig.from_env({**GOOD_ENV, "SHARDYARD_DEVICE": value}).device == device


@pytest.mark.parametrize(
    ("interval", "every", "gradients", "steps"),
    [
        pytest.param("1", "1", True, GRADIENT_CHECKPOINT_STEPS, id="gradients"),
        pytest.param("1", "3", True, 3 * GRADIENT_CHECKPOINT_STEPS, id="gradients-every-3"),
        pytest.param("1", "0", True, None, id="gradients-never"),
        pytest.param("2", "1", False, None, id="parameters"),
    ],
)
def test_sync_interval_one_averages_gradients_and_checkpoints_by_steps(
    interval: str, every: str, gradients: bool, steps: int | None
) -> None:
    cfg = RunConfig.from_env({**GOOD_ENV, "SHARDYARD_SYNC_INTERVAL": interval, "SHARDYARD_CHECKPOINT_EVERY": every})
    assert (cfg.averages_gradients, cfg.checkpoint_steps) == (gradients, steps)


@pytest.mark.parametrize(
    ("device", "local_rank", "gpus", "placed"),
    [
        pytest.param("auto", 0, 0, ("cpu", None, "gloo"), id="auto-no-cuda"),
        pytest.param("auto", 3, 4, ("cuda", 3, "nccl"), id="auto-gpu-3"),
        pytest.param("cpu", 1, 4, ("cpu", None, "gloo"), id="cpu-insists"),
        pytest.param("cuda", 0, 1, ("cuda", 0, "nccl"), id="cuda"),
    ],
)
def test_one_gpu_per_shard_by_local_rank(
    device: str, local_rank: int, gpus: int, placed: tuple[str, int | None, str]
) -> None:
    placement = choose_placement(device, local_rank, gpus)  # type: ignore[arg-type]
    assert placement == Placement(torch.device(placed[0], placed[1]), placed[2])


@pytest.mark.parametrize(
    ("device", "local_rank", "gpus", "says"),
    [
        pytest.param("cuda", 0, 0, "CUDA is not available", id="no-cuda"),
        pytest.param("auto", 2, 2, "LOCAL_RANK=2 names GPU 2, but only 2", id="no-such-gpu"),
    ],
)
def test_a_missing_gpu_is_a_device_error(device: str, local_rank: int, gpus: int, says: str) -> None:
    with pytest.raises(DeviceError, match=says):
        choose_placement(device, local_rank, gpus)  # type: ignore[arg-type]


def test_recovery_and_pace_settings() -> None:
    cfg = RunConfig.from_env(
        {
            **GOOD_ENV,
            "SHARDYARD_CHECKPOINT_EVERY": "0",
            "SHARDYARD_SYNC_TIMEOUT_S": "2.5",
            "SHARDYARD_SLOW_SYNC_FACTOR": "1.5",
        }
    )
    assert (cfg.checkpoint_every, cfg.sync_timeout_s, cfg.slow_sync_factor) == (0, 2.5, 1.5)


@pytest.mark.parametrize(
    ("value", "resume_dir"), [("/out/ckpt/checkpoint", Path("/out/ckpt/checkpoint")), ("  ", None)]
)
def test_resume_dir(value: str, resume_dir: Path | None) -> None:
    assert RunConfig.from_env({**GOOD_ENV, "SHARDYARD_RESUME_DIR": value}).resume_dir == resume_dir


@pytest.mark.parametrize(
    ("value", "agent_store"),
    [("True", True), (None, False), ("False", False), ("true", False), ("1", False)],
    ids=["torchrun", "unset", "false", "lowercase", "one"],
)
def test_agent_store_only_as_torch_reads_it(value: str | None, agent_store: bool) -> None:
    env = GOOD_ENV if value is None else {**GOOD_ENV, "TORCHELASTIC_USE_AGENT_STORE": value}
    assert RunConfig.from_env(env).agent_store is agent_store


def test_config_is_frozen() -> None:
    cfg = RunConfig.from_env(GOOD_ENV)
    with pytest.raises(AttributeError):
        cfg.rank = 3  # type: ignore[misc]


@pytest.mark.parametrize("name", sorted(GOOD_ENV))
def test_missing_required_variable(name: str) -> None:
    env = {k: v for k, v in GOOD_ENV.items() if k != name}
    with pytest.raises(ConfigError, match=f"{name} is not set"):
        RunConfig.from_env(env)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RANK", "-1"),
        ("RANK", "one"),
        ("WORLD_SIZE", "0"),
        ("LOCAL_RANK", "-2"),
        ("MASTER_ADDR", ""),
        ("MASTER_PORT", "0"),
        ("MASTER_PORT", "70000"),
        ("MASTER_PORT", "http"),
        ("SHARDYARD_MODEL_DIR", ""),
        ("SHARDYARD_DATASET_DIR", ""),
        ("SHARDYARD_OUTPUT_DIR", ""),
        ("SHARDYARD_SYNC_INTERVAL", "0"),
        ("SHARDYARD_SYNC_INTERVAL", "1.5"),
        ("SHARDYARD_MAX_STEPS", "0"),
        ("SHARDYARD_BATCH_SIZE", "-8"),
        ("SHARDYARD_SEQ_LEN", "0"),
        ("SHARDYARD_LR", "0"),
        ("SHARDYARD_LR", "nan"),
        ("SHARDYARD_LR", "fast"),
        ("SHARDYARD_SEED", "-1"),
        ("SHARDYARD_SEED", str(2**63)),
        ("SHARDYARD_PROGRESS_FD", "-1"),
        ("SHARDYARD_PROGRESS_FD", "stdout"),
        ("SHARDYARD_DIST_TIMEOUT_S", "0"),
        ("SHARDYARD_DIST_TIMEOUT_S", "inf"),
        ("SHARDYARD_CHECKPOINT_EVERY", "-1"),
        ("SHARDYARD_CHECKPOINT_EVERY", "every"),
        ("SHARDYARD_SYNC_TIMEOUT_S", "0"),
        ("SHARDYARD_SYNC_TIMEOUT_S", "nan"),
        ("SHARDYARD_SLOW_SYNC_FACTOR", "1"),
        ("SHARDYARD_SLOW_SYNC_FACTOR", "inf"),
        ("SHARDYARD_DEVICE", "tpu"),
        ("SHARDYARD_DEVICE", "cuda:1"),
    ],
)
def test_bad_value_is_rejected_with_its_name(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name) as info:
        RunConfig.from_env({**GOOD_ENV, name: value})
    assert len(info.value.problems) == 1
    assert repr(value) in str(info.value)


def test_rank_must_be_below_world_size() -> None:
    with pytest.raises(ConfigError, match="RANK=2 must be < WORLD_SIZE=2"):
        RunConfig.from_env({**GOOD_ENV, "RANK": "2"})


def test_every_problem_is_reported_at_once() -> None:
    env = {**GOOD_ENV, "SHARDYARD_LR": "x", "SHARDYARD_SEQ_LEN": "0"}
    del env["RANK"]
    with pytest.raises(ConfigError) as info:
        RunConfig.from_env(env)
    assert len(info.value.problems) == 3


def test_runner_exits_user_error_on_bad_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main({"RANK": "0"}) == exitcodes.USER_ERROR
    assert "WORLD_SIZE is not set" in capsys.readouterr().err


def test_runner_exits_user_error_on_closed_progress_fd(capsys: pytest.CaptureFixture[str]) -> None:
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    assert main({**GOOD_ENV, "SHARDYARD_PROGRESS_FD": str(w)}) == exitcodes.USER_ERROR
    assert "SHARDYARD_PROGRESS_FD" in capsys.readouterr().err


class OutOfMemoryError(RuntimeError):
    """Named like ``torch.cuda.OutOfMemoryError``."""


@pytest.mark.parametrize(
    ("exc", "code", "says"),
    [
        pytest.param(OutOfMemoryError("CUDA out of memory"), exitcodes.OOM, "out of memory", id="cuda-oom"),
        pytest.param(MemoryError(), exitcodes.OOM, "out of memory", id="memory-error"),
        pytest.param(
            RuntimeError("CUDA error: an illegal memory access was encountered"),
            exitcodes.GPU_FAULT,
            "GPU fault",
            id="gpu-fault",
        ),
        pytest.param(SyncTimeoutError("AllReduce timed out"), exitcodes.SYNC_TIMEOUT, "sync timeout", id="timeout"),
        pytest.param(CommError("Connection closed by peer"), exitcodes.COMM_ERROR, "communication", id="comm"),
        pytest.param(DeviceError("LOCAL_RANK=3 names GPU 3"), exitcodes.GPU_FAULT, "GPU fault", id="no-gpu"),
        pytest.param(KeyError("bug"), exitcodes.INTERNAL_ERROR, "internal error", id="bug"),
    ],
)
def test_runner_exit_code_by_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], exc: Exception, code: int, says: str
) -> None:
    def failing(cfg: RunConfig, reporter: ProgressReporter, stop: StopFlag, term: object = None) -> runner.Outcome:
        raise exc

    monkeypatch.setattr(runner, "train", failing)

    assert main(GOOD_ENV, stop=StopFlag()) == code
    assert says in capsys.readouterr().err


def test_without_a_global_batch_a_step_is_world_size_times_batch_size() -> None:
    cfg = RunConfig.from_env(GOOD_ENV)
    assert (cfg.global_batch, cfg.step_batch, cfg.batch_slice, cfg.loss_weight) == (None, 16, (8, 16), 1.0)


@pytest.mark.parametrize(
    ("rank", "world", "interval", "slice_", "weight"),
    [
        pytest.param("0", "4", "1", (0, 2), 4 / 3, id="gradients-larger-slice"),
        pytest.param("3", "4", "1", (5, 6), 2 / 3, id="gradients-smaller-slice"),
        pytest.param("1", "2", "1", (3, 6), 1.0, id="gradients-even"),
        pytest.param("3", "4", "10", (5, 6), 1.0, id="local-sgd-unweighted"),
    ],
)
def test_a_global_batch_is_sliced_over_the_ranks_and_weights_their_losses(
    rank: str, world: str, interval: str, slice_: tuple[int, int], weight: float
) -> None:
    env = {**GOOD_ENV, "RANK": rank, "WORLD_SIZE": world, "SHARDYARD_SYNC_INTERVAL": interval}
    cfg = RunConfig.from_env({**env, "SHARDYARD_GLOBAL_BATCH": "6"})
    assert (cfg.global_batch, cfg.step_batch, cfg.batch_slice) == (6, 6, slice_)
    assert cfg.loss_weight == pytest.approx(weight)


@pytest.mark.parametrize(
    ("value", "says"),
    [("0", "is not an integer >= 1"), ("x", "is not an integer >= 1"), ("1", "must be >= WORLD_SIZE=2")],
)
def test_a_bad_global_batch_is_a_config_error(value: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"SHARDYARD_GLOBAL_BATCH='?{value}'?.* {says}"):
        RunConfig.from_env({**GOOD_ENV, "SHARDYARD_GLOBAL_BATCH": value})


@pytest.mark.parametrize(("given", "expected"), [(12, "12"), (None, None)])
def test_the_agent_passes_the_workloads_global_batch_to_every_shard(given: int | None, expected: str | None) -> None:
    paths = ShardPaths(model=Path("/m"), dataset=Path("/d"), output=Path("/o"))
    for entrypoint in (None, Entrypoint(command=["python", "train.py"])):  # the built-in runner and a job's own script
        shard = assignment(workload=workload(global_batch=given, entrypoint=entrypoint))
        env = shard_env(shard, paths, base_env={})
        assert env.get(GLOBAL_BATCH_ENV) == expected
        if entrypoint is None:
            assert RunConfig.from_env(env).step_batch == (given or 2 * 8)
