"""Users' own scripts end to end (issue 6): an unmodified DistributedDataParallel script runs as a 2-shard job to
SUCCEEDED and its loss falls, as its shards' logs show; the same script with the ``shardyard.train`` client reports
progress, checkpoints through the runtime and ends with its final loss in the job's status."""

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli_cluster import cli
from tests.e2e.test_placement_e2e import submit, until
from tests.support.cluster import ONE_REPLICA

pytestmark = [pytest.mark.slow, pytest.mark.broker]

ROOT = Path(__file__).parents[2]
STEP_LOSS = re.compile(r"step (\d+) loss ([0-9.eE+-]+)")
STEPS = 200


def entry_job(task_id: str, script: str, *, model: str, sync_interval: int) -> dict[str, Any]:
    """``examples/ddp_job.json`` with this interpreter (the agent's PATH may not lead to it) and the repository as
    the working directory (``/data/code``, which the cluster fixture links to it: a working directory is a job path
    under an allowed prefix), so the script's relative path resolves whichever directory the agents run in."""
    document: dict[str, Any] = json.loads((ROOT / "examples" / "ddp_job.json").read_text())
    document["task_id"] = task_id
    document["resource_requirements"]["gpu"] = {"count": 2, "model": model}
    document["sync_interval"] = sync_interval
    document["training"] = {"max_steps": STEPS}  # the monitor's progress bar
    entrypoint = document["entrypoint"]
    assert entrypoint["command"][:2] == ["python", "examples/ddp_train.py"]
    entrypoint["command"] = [sys.executable, script, "--steps", str(STEPS), "--log-every", "20"]
    entrypoint["working_dir"] = "/data/code"
    return document


def ended(job: dict[str, Any]) -> bool:
    return job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cluster of two A100 nodes and a V100:2 node, running the plain script (A100s) and the client one (V100s)
    side by side."""
    run_dir = tmp_path_factory.mktemp("entrypoint")
    for artifact in ("models/gpt2_pretrained", "datasets/wikitext"):  # the example's dependencies: any directories
        (run_dir / "data" / artifact).mkdir(parents=True)
    (run_dir / "data" / "code").symlink_to(ROOT, target_is_directory=True)
    started = cli("up", *ONE_REPLICA, run_dir=run_dir, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        submit(run_dir, entry_job("ddp-plain", "examples/ddp_train.py", model="A100", sync_interval=50))
        submit(run_dir, entry_job("ddp-client", "examples/ddp_train_shardyard.py", model="V100", sync_interval=40))
        yield run_dir
    finally:
        cli("down", run_dir=run_dir, timeout=120)


def losses(run_dir: Path, job_id: str, shard: int) -> list[tuple[int, float]]:
    shown = cli("logs", job_id, "--shard", str(shard), run_dir=run_dir)
    assert shown.returncode == 0, shown.stderr
    assert "shardyard entry:" not in shown.stdout, shown.stdout  # the supervisor had nothing to explain
    return [(int(step), float(loss)) for step, loss in STEP_LOSS.findall(shown.stdout)]


@pytest.mark.timeout(600)
def test_an_unmodified_ddp_script_runs_as_a_2_shard_job_and_its_loss_falls(cluster: Path) -> None:
    done = until(cluster, "ddp-plain", ended, 420)

    assert done["state"] == "SUCCEEDED", json.dumps(done["timeline"][-8:])
    assert {p["gpu_model"] for p in done["placements"]} == {"A100"}
    for shard in (0, 1):
        curve = losses(cluster, "ddp-plain", shard)
        assert [step for step, _ in curve][:2] == [1, 20] and curve[-1][0] == STEPS, curve
        first, last = curve[0][1], curve[-1][1]
        assert last < 0.5 * first, f"shard {shard}: loss {first} -> {last}"


@pytest.mark.timeout(600)
def test_the_client_reports_progress_and_checkpoints_through_the_runtime(cluster: Path) -> None:
    done = until(cluster, "ddp-client", ended, 420)

    assert done["state"] == "SUCCEEDED", json.dumps(done["timeline"][-8:])
    assert done["step"] == STEPS
    assert float(done["final_loss"]) < 0.5 * float(done["first_loss"]), (done["first_loss"], done["final_loss"])
    assert all(shard["syncs"] >= STEPS // 40 for shard in done["shards"].values()), done["shards"]
    checkpoint = done["last_checkpoint"]
    assert checkpoint is not None and checkpoint["step"] >= STEPS - 40, checkpoint
    local = cluster / "data" / Path(checkpoint["dir"]).relative_to("/data")
    assert json.loads((local / "shardyard-train.json").read_text())["step"] == STEPS
