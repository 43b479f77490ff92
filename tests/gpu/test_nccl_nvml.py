"""The GPU path, wherever CUDA is present (skipped elsewhere, so CI on CPU collects and skips it): NCCL between one
process per GPU (world size = the GPU count; one GPU still checks NCCL's start-up and an AllReduce), the runner on
``cuda:LOCAL_RANK``, and the node agent's NVML telemetry of every GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from shardyard.training import exitcodes
from shardyard.training.artifacts import DemoArtifacts, create_demo_artifacts
from tests.support.runners import Launcher, free_port, runners, train_env
from tests.support.runners import wait_exit as _wait

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a GPU and its driver)"),
]

ROOT = Path(__file__).parents[2]
GIB = 1024**3


def _gpus() -> int:
    return torch.cuda.device_count()


def nccl_rank() -> None:
    """One rank's process: NCCL on ``cuda:LOCAL_RANK``, a raw AllReduce and the runtime's syncs; results as JSON."""
    import torch.distributed as dist

    from shardyard.training.sync import GradSync, ParamSync

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method="env://", rank=rank, world_size=world, device_id=device)
    try:
        raw = torch.full((1024,), float(rank + 1), device=device)
        dist.all_reduce(raw)
        params = [torch.nn.Parameter(torch.full((1000,), float(rank + 1), device=device)) for _ in range(3)]
        for p in params:
            p.grad = torch.full_like(p, float(10 * (rank + 1)))
        grads = GradSync(params, bucket_bytes=4000).allreduce_mean(slow=rank == 0)
        synced = ParamSync(params).allreduce_mean(stop=rank == world - 1)
        torch.cuda.synchronize()
        result = {
            "raw": raw.unique().tolist(),
            "params": sorted({v for p in params for v in p.detach().unique().tolist()}),
            "grads": sorted({v for p in params if p.grad is not None for v in p.grad.unique().tolist()}),
            "devices": sorted({str(p.device) for p in params}),
            "grad_stats": [grads.bytes, grads.buckets, grads.slow_votes],
            "param_stats": [synced.bytes, synced.buckets, synced.stop],
        }
    finally:
        dist.destroy_process_group()
    Path(os.environ["RESULT_DIR"], f"rank-{rank}.json").write_text(json.dumps(result))


def test_nccl_allreduce_and_the_runtime_syncs_on_every_gpu(tmp_path: Path) -> None:
    world = _gpus()
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "RESULT_DIR": str(tmp_path),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        code = "from tests.gpu.test_nccl_nvml import nccl_rank; nccl_rank()"
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, stderr=subprocess.PIPE))
    try:
        errors = [proc.communicate(timeout=180)[1].decode(errors="replace") for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [proc.returncode for proc in procs] == [0] * world, "\n".join(errors)

    mean = (world + 1) / 2
    for rank in range(world):
        result = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert result["raw"] == [world * (world + 1) / 2]
        assert result["devices"] == [f"cuda:{rank}"]
        assert result["params"] == [mean] and result["grads"] == [10 * mean]
        if world > 1:
            assert result["grad_stats"] == [3 * 4000, 3, 1]  # one bucket a parameter; rank 0's slow vote counted
            assert result["param_stats"] == [3 * 4000, 1, True]  # the last rank's stop request, agreed
        else:
            assert result["grad_stats"][0] == result["param_stats"][0] == 0  # one rank: nothing to send


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> DemoArtifacts:
    return create_demo_artifacts(tmp_path_factory.mktemp("data"), seed=0)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launcher]:
    with runners(tmp_path) as start:
        yield start


@pytest.mark.parametrize("sync_interval", [1, 5], ids=["gradients", "parameters"])
def test_the_runner_trains_on_cuda_local_rank_over_nccl(
    artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path, sync_interval: int
) -> None:
    world = _gpus()
    env = train_env(
        artifacts,
        tmp_path / "out",
        SHARDYARD_DEVICE="cuda",
        SHARDYARD_SYNC_INTERVAL=str(sync_interval),
        SHARDYARD_MAX_STEPS="60",
        SHARDYARD_CHECKPOINT_EVERY="1",
    )
    shards = launch(world, env)
    rcs = [_wait(shard, 300) for shard in shards]

    assert rcs == [exitcodes.OK] * world, "\n".join(s.stderr() for s in shards)
    for shard in shards:
        assert f"training on cuda:{shard.rank} over nccl" in shard.stderr()
        assert shard.lines[-1]["kind"] == "finished" and shard.lines[-1]["steps"] == 60
        progress = shard.progress()
        # The first progress line is the first step's; on a fast GPU all 60 steps can fall in its one second.
        assert shard.lines[-1]["final_loss"] < progress[0]["loss"]
        if world > 1:
            assert any(p["allreduce_bytes"] > 0 for p in progress)
    assert (tmp_path / "out" / "config.json").is_file()


def test_nvml_reports_utilisation_memory_and_temperature_of_every_gpu() -> None:
    from shardyard.node_agent.inventory import GpuProbeUnavailable, NvmlGpus

    try:
        probe = NvmlGpus()
    except GpuProbeUnavailable as exc:
        pytest.skip(f"NVML unavailable: {exc}")
    gpus = probe.probe({})
    assert len(gpus) >= _gpus()
    for gpu in gpus:
        assert not gpu.simulated and gpu.healthy and gpu.model
        assert gpu.memory_bytes > GIB and 0 <= gpu.memory_used_bytes <= gpu.memory_bytes
        assert 0.0 <= gpu.utilization <= 1.0
        assert 0.0 < gpu.temperature_c < 120.0

    # The readings are live: cuda:0 busy and holding 2 GiB more shows in its NVML figures.
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    index = next((i for i, u in enumerate(probe.uuids()) if u and u.endswith(uuid)), 0)
    before = gpus[index].memory_used_bytes
    held = torch.ones(2 * GIB // 4, device="cuda:0")
    done = threading.Event()

    def busy() -> None:
        a = torch.randn(4096, 4096, device="cuda:0")
        while not done.is_set():
            a = (a @ a).tanh_()
            torch.cuda.synchronize()

    worker = threading.Thread(target=busy, daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 15
        seen = probe.probe({})[index]
        while seen.utilization == 0.0 and time.monotonic() < deadline:
            time.sleep(0.2)
            seen = probe.probe({})[index]
    finally:
        done.set()
        worker.join()
    assert seen.utilization > 0.0
    assert seen.memory_used_bytes - before >= GIB
    del held
