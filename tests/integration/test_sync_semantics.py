"""``sync_interval: 1`` is synchronous data parallelism: two gloo ranks train exactly as one process would on the
concatenation of their batches. Real processes running the runner's training loop on localhost, on the CPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from shardyard.training import exitcodes
from shardyard.training.artifacts import DemoArtifacts, create_demo_artifacts
from shardyard.training.data import ByteDataset
from shardyard.training.model import TinyGPTConfig, load_pretrained
from tests.support.runners import Launcher, free_port, runners, train_env, until
from tests.support.runners import wait_exit as _wait

TEST_MODEL = TinyGPTConfig(n_positions=32, n_embd=32, n_layer=1, n_head=2)
STEPS, BATCH, SEQ, LR, SEED = 25, 4, 32, 3e-3, 5
ATOL = RTOL = 1e-4
"""Float tolerance. Not 1e-5: the attention's key bias has a zero gradient in exact arithmetic (softmax ignores a
constant added to all of a query's scores), and AdamW scales the float noise there up to steps of about ``LR``. Two
ranks and one process sum in different orders, so those few elements end ~1e-5 apart after 25 steps; every other
element agrees to ~1e-7. Averaging parameters after local steps instead ends >= 4e-3 away on every tensor."""
ROOT = Path(__file__).parents[2]
Params = dict[str, torch.Tensor]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> DemoArtifacts:
    return create_demo_artifacts(tmp_path_factory.mktemp("data"), seed=0, model_config=TEST_MODEL, text_bytes=50_000)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launcher]:
    with runners(tmp_path) as start:
        yield start


def _env(artifacts: DemoArtifacts, output_dir: Path, **extra: str) -> dict[str, str]:
    run = {
        "SHARDYARD_DEVICE": "cpu",
        "SHARDYARD_SYNC_INTERVAL": "1",
        "SHARDYARD_MAX_STEPS": str(STEPS),
        "SHARDYARD_BATCH_SIZE": str(BATCH),
        "SHARDYARD_SEQ_LEN": str(SEQ),
        "SHARDYARD_LR": repr(LR),
        "SHARDYARD_SEED": str(SEED),
    }
    return train_env(artifacts, output_dir, **{**run, **extra})


def keep_parameters() -> None:
    """A rank's process: ``runner.train`` as the shard runs it, then this rank's final parameters saved beside the
    output directory (the runner saves rank 0's only)."""
    from shardyard.training import runner
    from shardyard.training.config import RunConfig
    from shardyard.training.preemption import StopFlag
    from shardyard.training.progress import ProgressReporter

    models: list[torch.nn.Module] = []

    class Keeping(runner.GangSync):
        def __init__(self, cfg: RunConfig, model: torch.nn.Module, *args: object) -> None:
            super().__init__(cfg, model, *args)  # type: ignore[arg-type]
            models.append(model)

    runner.GangSync = Keeping  # type: ignore[misc]
    cfg = RunConfig.from_env(os.environ)
    runner.train(cfg, ProgressReporter(None), StopFlag())
    torch.save(_params(models[0]), cfg.output_dir.parent / f"rank-{cfg.rank}.pt")


def _params(model: torch.nn.Module) -> Params:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _loss(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(inputs)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def _one_process(artifacts: DemoArtifacts) -> Params:
    """One process, one model, batches of 2 x BATCH: what the two ranks draw together (ByteDataset.batches)."""
    model = load_pretrained(artifacts.model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    stream = ByteDataset.from_dir(artifacts.dataset_dir).batches(0, 1, 2 * BATCH, SEQ, SEED)
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        _loss(model, *next(stream)).backward()
        optimizer.step()
    return _params(model)


def _local_steps_then_average(artifacts: DemoArtifacts) -> Params:
    """What parameter averaging after every local step would give (two ranks simulated in one process)."""
    models = [load_pretrained(artifacts.model_dir) for _ in range(2)]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=LR) for m in models]
    dataset = ByteDataset.from_dir(artifacts.dataset_dir)
    streams = [dataset.batches(rank, 2, BATCH, SEQ, SEED) for rank in range(2)]
    for _ in range(STEPS):
        for model, optimizer, stream in zip(models, optimizers, streams, strict=True):
            optimizer.zero_grad(set_to_none=True)
            _loss(model, *next(stream)).backward()
            optimizer.step()
        with torch.no_grad():
            for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
                a.copy_((a + b) / 2)
                b.copy_(a)
    return _params(models[0])


def test_two_ranks_end_with_the_parameters_of_one_process_on_the_combined_batches(
    artifacts: DemoArtifacts, tmp_path: Path
) -> None:
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = {
            **os.environ,
            **_env(artifacts, tmp_path / "out", SHARDYARD_CHECKPOINT_EVERY="0"),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "SHARDYARD_DIST_TIMEOUT_S": "30",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        code = "from tests.integration.test_sync_semantics import keep_parameters; keep_parameters()"
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, stderr=subprocess.PIPE))
    try:
        errors = [proc.communicate(timeout=120)[1].decode(errors="replace") for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [proc.returncode for proc in procs] == [0, 0], "\n".join(errors)
    ranks = [torch.load(tmp_path / f"rank-{rank}.pt") for rank in (0, 1)]

    single = _one_process(artifacts)
    local_sgd = _local_steps_then_average(artifacts)

    assert ranks[0].keys() == ranks[1].keys() == single.keys()
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])  # the same update on every rank
    for k in single:
        torch.testing.assert_close(ranks[0][k], single[k], atol=ATOL, rtol=RTOL)
    # The tolerance tells the semantics apart: averaging parameters after local AdamW steps ends elsewhere.
    for k in single:
        assert not torch.allclose(local_sgd[k], single[k], atol=10 * ATOL, rtol=RTOL), k
    start = load_pretrained(artifacts.model_dir).state_dict()
    moved = max(float((ranks[0][k] - start[k]).abs().max()) for k in ranks[0])
    gap = max(float((local_sgd[k] - single[k]).abs().max()) for k in single)
    print(f"\n{STEPS} steps: parameters moved up to {moved:.2e}; local SGD ends up to {gap:.2e} away")


def test_a_stop_request_stops_both_ranks_at_one_step(
    artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path
) -> None:
    output_dir = tmp_path / "out"
    rank0, rank1 = launch(2, _env(artifacts, output_dir, SHARDYARD_MAX_STEPS="1000000"))
    until(lambda: any(p["step"] >= 20 for p in rank1.progress()), 60, "rank 1 at step 20")
    rank1.proc.send_signal(signal.SIGUSR1)  # rank 0 learns it at the next step's gradient sync

    rcs = [_wait(shard, 60) for shard in (rank0, rank1)]

    assert rcs == [exitcodes.PREEMPTED, exitcodes.PREEMPTED], "\n".join(s.stderr() for s in (rank0, rank1))
    ends = [shard.lines[-1] for shard in (rank0, rank1)]
    assert ends[0]["kind"] == ends[1]["kind"] == "preempted" and ends[0]["step"] == ends[1]["step"]
    state = load_pretrained(output_dir / "checkpoint")
    assert state.config == TEST_MODEL


def test_slow_gradient_syncs_are_counted_but_never_widen_the_interval(
    artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path
) -> None:
    env = _env(artifacts, tmp_path / "out", SHARDYARD_MAX_STEPS="400", SHARDYARD_SLOW_SYNC_FACTOR="3")
    rank0, rank1 = launch(2, env)
    until(lambda: any(p["step"] >= 40 for p in rank1.progress()), 60, "rank 1 at step 40")
    done = threading.Event()

    def throttle() -> None:  # rank 1 pauses now and then: rank 0 waits for it in a gradient sync
        while not done.is_set() and rank1.proc.poll() is None:
            rank1.proc.send_signal(signal.SIGSTOP)
            time.sleep(0.2)
            rank1.proc.send_signal(signal.SIGCONT)
            time.sleep(0.3)

    thread = threading.Thread(target=throttle, daemon=True)
    thread.start()
    try:
        rcs = [_wait(shard, 120) for shard in (rank0, rank1)]
    finally:
        done.set()
        thread.join()
        if rank1.proc.poll() is None:
            rank1.proc.send_signal(signal.SIGCONT)

    assert rcs == [exitcodes.OK, exitcodes.OK], "\n".join(s.stderr() for s in (rank0, rank1))
    seen = [{p["step"]: (p["sync_interval"], p["slow_syncs"]) for p in shard.progress()} for shard in (rank0, rank1)]
    assert all(interval == 1 for ranks in seen for interval, _ in ranks.values())
    both = seen[0].keys() & seen[1].keys()
    assert all(seen[0][step] == seen[1][step] for step in both)  # every rank counts the same agreed verdicts
    assert max(slow for _, slow in seen[0].values()) >= 1
    assert "sync interval 1 ->" not in rank0.stderr() + rank1.stderr()
