"""The resize rows of ``bench/elastic.py`` (issue 35): a running elastic gang grown and shrunk on a local cluster of
two A100:2 nodes, the scheduler's resize cooldown at ``--resize-cooldown-s``.

An elastic job (``min_shards`` 2, preferred 4, ``max_shards`` 4, gradient averaging, ``batch_size`` 2) starts at 2
beside a job's own script that holds the other 2 GPUs. Once its attempt is past the cooldown the script is
cancelled, and the gang grows; then a priority-9 script that needs 2 GPUs arrives, and the gang shrinks; once that
script ends, the gang grows back and trains to ``--steps``. Then a rigid 4-shard job of the same seed, batch and steps
trains over the same samples. Measured:

- ``scale_up_s``: the GPUs free (the script's ``cancelled``) -> every shard of the grown gang reporting a step (the
  job's detail, polled every 0.1 s); beside it, ``resized_s`` (-> ``job.resized``) and ``running_s`` (-> its shards
  all started);
- ``steps_lost`` of each resize: the last step the stopped gang's ranks completed (the state each kept, from their
  logs) less the step the re-formed gang resumed from (its logs);
- ``shrink_s``: the arrival (its submission) -> its placement on the GPUs the gang gave up;
- the final loss: each job's final model evaluated on the same held-out windows (``eval_loss``, 256 windows drawn
  with a seed of their own; ``loss_ratio`` elastic / fixed: within 2 % is the target), beside each run's last
  step's loss (``last_step_loss``: one batch's, noisier). ``noise_ratio`` is the same comparison for fixed-size
  runs that differ from the fixed one only in the order of their float sums (2 shards of 4 samples, 1 shard of 8,
  against 4 of 2: the same global batch, samples and seed): how far apart runs that compute the same update drift
  over ``--steps``;
- CPU seconds per component over the elastic job's life.
"""

import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from shardyard.cli import client, cluster
from shardyard.cli.cluster_info import ClusterInfo
from shardyard.cli.rundir import shard_log_dir

EXAMPLE = json.loads((Path(__file__).parents[1] / "examples" / "fine_tune_gpt2.json").read_text())
KEPT = re.compile(r"kept the gang's state of step (\d+)")
RESUMED = re.compile(r"resuming from its peers' state of step (\d+)")
RESUMED_AT = re.compile(r"resuming from \S+ at step (\d+)")
STEPPED = re.compile(r"\]: step (\d+)/")
COOLDOWN_ENV = "SHARDYARD_RESIZE_COOLDOWN_S"


def _resources(count: int) -> dict[str, Any]:
    return {"gpu": {"count": count, "model": "A100", "min_flops": 35}, "memory": f"{count}GiB", "cpu_cores": count}


def training_job(task_id: str, *, steps: int, elastic: bool, shards: int = 4) -> bytes:
    """Gradient averaging over a global batch of 8 (``shards`` x ``8 // shards``), seed 7."""
    document = {**EXAMPLE, "task_id": task_id, "sync_interval": 1, "shard_count": shards, "priority": 1}
    document["resource_requirements"] = _resources(shards)
    document["training"] = {"max_steps": steps, "batch_size": 8 // shards, "seed": 7}
    if elastic:
        document["elasticity"] = {"min_shards": 2, "max_shards": 4}
    return json.dumps(document).encode()


def holder(task_id: str, *, count: int, priority: int, seconds: float) -> bytes:
    """A job's own script that holds ``count`` GPUs for ``seconds``."""
    command = [sys.executable, "-c", f"import time; time.sleep({seconds})"]
    document = {**EXAMPLE, "task_id": task_id, "shard_count": count, "priority": priority}
    document["resource_requirements"] = _resources(count)
    document["entrypoint"] = {"command": command}
    return json.dumps(document).encode()


def _until(check: Callable[[], Any], what: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise SystemExit(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _at(job: dict[str, Any], event: str, nth: int = 0) -> float:
    times = sorted(datetime.fromisoformat(e["at"]).timestamp() for e in job["timeline"] if e["event"] == event)
    return times[nth]


def _job(info: ClusterInfo, job_id: str) -> dict[str, Any]:
    return client.job(info.monitor_url, job_id) or {}


def _training_at(info: ClusterInfo, job_id: str, attempt: int, size: int) -> float:
    """When every shard of ``attempt`` (of ``size``) first showed a step: polled."""

    def trained() -> bool:
        shards = _job(info, job_id).get("shards", {})
        ours = [s for s in shards.values() if s.get("attempt") == attempt and s.get("step", 0) > 0]
        return len(ours) == size

    try:
        _until(trained, f"{job_id}'s attempt {attempt} training at {size}", 180)
    except SystemExit as exc:  # what the job went through instead, for whoever reads the failure
        found = _job(info, job_id)
        timeline = [f"{e['at']} {e['event']}" for e in found.get("timeline", [])]
        shards = {k: (s.get("attempt"), s.get("step")) for k, s in found.get("shards", {}).items()}
        said = f"{exc}; state {found.get('state')}, shards {shards}, timeline:\n" + "\n".join(timeline)
        raise SystemExit(said) from None
    return time.time()


def steps_lost(run_dir: Path, job_id: str, attempt: int) -> int:
    """The last step the ranks of ``attempt - 1`` completed (the state each kept when stopped, or a step logged)
    less the step ``attempt`` resumed from (its peers' state, a checkpoint, or the start)."""

    def text(number: int) -> str:
        logs = client.shard_logs(shard_log_dir(run_dir, job_id), job_id, attempt=number)
        return "".join(log.path.read_text(errors="replace") for log in logs)

    before, after = text(attempt - 1), text(attempt)
    done = [int(s) for s in (*KEPT.findall(before), *STEPPED.findall(before))]
    resumed = {int(s) for s in (*RESUMED.findall(after), *RESUMED_AT.findall(after))} or {0}
    if len(resumed) != 1:
        raise SystemExit(f"{job_id} attempt {attempt}: the ranks resumed from {sorted(resumed)}\n{after[-3000:]}")
    return max(done, default=0) - resumed.pop()


@contextmanager
def _cooldown(seconds: float) -> Iterator[None]:
    """The services ``up`` starts read the scheduler's settings from the environment they inherit."""
    before = os.environ.get(COOLDOWN_ENV)
    os.environ[COOLDOWN_ENV] = str(seconds)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(COOLDOWN_ENV, None)
        else:
            os.environ[COOLDOWN_ENV] = before


def eval_loss(model_dir: Path, dataset_dir: Path, *, seq_len: int, windows: int = 256, seed: int = 12345) -> float:
    """The mean cross-entropy of the model in ``model_dir`` over ``windows`` windows of the dataset (seeded)."""
    import torch
    import torch.nn.functional as F

    from shardyard.training.data import ByteDataset
    from shardyard.training.model import load_pretrained

    model = load_pretrained(model_dir).eval()
    inputs, targets = next(ByteDataset.from_dir(dataset_dir).batches(0, 1, windows, seq_len, seed))
    with torch.no_grad():
        logits = model(inputs)
        return float(F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1)))


def resize(
    root: Path,
    *,
    steps: int,
    cooldown_s: float,
    vip_s: float,
    cpu: Callable[[Path], dict[str, float]],
    spent: Callable[[dict[str, float], dict[str, float]], dict[str, float]],
    noise: bool = True,
) -> dict[str, Any]:
    """``noise``: also train the 2- and 1-shard references (how far fixed sizes' losses differ among themselves)."""
    run_dir, quiet = root / "resize-run", (lambda _m: None)
    references = ("fixed", "fixed-2", "fixed-1") if noise else ("fixed",)
    with _cooldown(cooldown_s):
        info = cluster.up(run_dir, nodes=("A100:2", "A100:2"), replicas=1, data_root=root / "data", say=quiet)
    try:
        figures = _phases(
            run_dir, info, steps=steps, cooldown_s=cooldown_s, vip_s=vip_s, cpu=cpu, spent=spent, references=references
        )
    finally:
        cluster.down(run_dir, say=quiet)
    data, seq_len = root / "data", figures.pop("seq_len")
    losses = {
        job: eval_loss(data / "checkpoints" / job, data / "datasets" / "wikitext", seq_len=seq_len)
        for job in ("elastic", *references)
    }
    return {
        **figures,
        "eval_loss": {job: round(loss, 5) for job, loss in losses.items()},
        "loss_ratio": round(losses["elastic"] / losses["fixed"], 4),
        "noise_ratio": {job: round(losses[job] / losses["fixed"], 4) for job in references[1:]},
    }


def _phases(
    run_dir: Path,
    info: ClusterInfo,
    *,
    steps: int,
    cooldown_s: float,
    vip_s: float,
    cpu: Callable[[Path], dict[str, float]],
    spent: Callable[[dict[str, float], dict[str, float]], dict[str, float]],
    references: tuple[str, ...],
) -> dict[str, Any]:
    client.submit(info.bootstrap, holder("filler", count=2, priority=0, seconds=3600))
    _until(lambda: _job(info, "filler").get("state") == "RUNNING", "the filler running", 120)
    cpu0 = cpu(run_dir)
    client.submit(info.bootstrap, training_job("elastic", steps=steps, elastic=True))
    first = _until(lambda: (j := _job(info, "elastic")).get("state") == "RUNNING" and j, "the elastic job", 180)
    started = len(first["placements"])
    _training_at(info, "elastic", 1, started)
    _until(lambda: time.time() - _at(first, "running") > cooldown_s + 1, "the cooldown", cooldown_s + 5)

    client.request_cancel(info.bootstrap, "filler", requested_by="bench")
    filler = _until(lambda: (j := _job(info, "filler")).get("state") == "CANCELLED" and j, "the cancel", 60)
    freed = _at(filler, "cancelled")
    at_4 = _training_at(info, "elastic", 2, 4)
    grown = _job(info, "elastic")
    grow = {
        "resized_s": round(_at(grown, "resized 2 -> 4") - freed, 2),
        "running_s": round(_at(grown, "running", 1) - freed, 2),
        "scale_up_s": round(at_4 - freed, 2),
        "steps_lost": steps_lost(run_dir, "elastic", 2),
    }

    arrived = time.time()
    client.submit(info.bootstrap, holder("vip", count=2, priority=9, seconds=vip_s))
    vip = _until(lambda: (j := _job(info, "vip")).get("state") == "RUNNING" and j, "the vip running", 120)
    _training_at(info, "elastic", 3, 2)
    shrunk = _job(info, "elastic")
    shrink = {
        "resized_s": round(_at(shrunk, "resized 4 -> 2") - arrived, 2),
        "shrink_s": round(_at(vip, "scheduled") - arrived, 2),
        "steps_lost": steps_lost(run_dir, "elastic", 3),
        "preempted": any(e["event"] in ("preempting", "preempted") for e in shrunk["timeline"]),
    }

    elastic = client.wait(info.monitor_url, "elastic", timeout_s=3600, on_update=lambda _j: None)
    elastic = _job(info, "elastic") or elastic
    cpu1 = cpu(run_dir)
    for name in references:
        shards = int(name.removeprefix("fixed").removeprefix("-") or 4)
        client.submit(info.bootstrap, training_job(name, steps=steps, elastic=False, shards=shards))
        done = client.wait(info.monitor_url, name, timeout_s=3600, on_update=lambda _j: None)
        if done.get("state") != "SUCCEEDED":
            raise SystemExit(f"{name} ended {done.get('state')}")
    fixed = _job(info, "fixed")
    if elastic.get("state") != "SUCCEEDED":
        raise SystemExit(f"elastic {elastic.get('state')}")
    sizes = [e["event"] for e in elastic["timeline"] if e["event"].startswith("resized")]
    return {
        "started_at_shards": started,
        "grow": grow,
        "shrink": shrink,
        "resizes": sizes,
        "retries": sum(1 for e in elastic["timeline"] if e["event"] == "recovering"),
        "recomputed_s": elastic["goodput"]["recomputed_s"],
        "last_step_loss": {"elastic": elastic["final_loss"], "fixed": fixed["final_loss"]},
        "seq_len": elastic["spec"]["seq_len"],
        "steps": steps,
        "cooldown_s": cooldown_s,
        "cpu_s": spent(cpu0, cpu1),
    }
