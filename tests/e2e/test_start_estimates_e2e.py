"""A waiting job's start as an interval, end to end (issue 37): on a real cluster of one A100, a job queued behind a
running one that declared its run time is shown with a median (p50) and a p90 start, ``shardyard status`` says
"starts in ~..., 90 %: within ...", ``shardyard jobs -o wide`` gives the short form, and the job is placed no later
than the p90 it was first shown.

Both jobs are their own script, a sleep, so that their length is the script's and not this machine's load. The
running job is not preemptible: the queued one can only wait for it."""

import json
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_placement_e2e import first_at, submit, until
from tests.support.cluster import ROOT, cli, local_cluster

pytestmark = [pytest.mark.slow, pytest.mark.broker]

HOLD_S = 40
"""How long the first job holds the GPU (and declares it will)."""
CLOCKS_S = 1.0
"""What the scheduler's clock and the monitor's may differ by."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with local_cluster(tmp_path_factory.mktemp("estimates"), ("A100:1",), replicas=1) as run_dir:
        yield run_dir


def sleeper(task_id: str, seconds: int, **fields: Any) -> dict[str, Any]:
    """A one-shard job on the A100 whose script sleeps ``seconds``, declaring that as its run time."""
    document: dict[str, Any] = json.loads((ROOT / "examples" / "ddp_job.json").read_text())
    document.update(task_id=task_id, shard_count=1, expected_duration_s=seconds, **fields)
    document["resource_requirements"] = {"gpu": {"count": 1, "model": "A100"}, "memory": "1GiB", "cpu_cores": 1}
    document["entrypoint"] = {"command": [sys.executable, "-c", f"import time; time.sleep({seconds})"]}
    return document


def both_estimates(job: dict[str, Any]) -> bool:
    return bool(job.get("estimated_start") and job.get("estimated_start_p90"))


def test_a_queued_job_is_shown_a_p50_and_p90_start_and_starts_by_its_p90(cluster: Path) -> None:
    submit(cluster, sleeper("holder", HOLD_S, preemptible=False))
    holder = first_at(until(cluster, "holder", lambda j: j["state"] == "RUNNING", 120), "scheduled")
    submit(cluster, sleeper("queued", 2))

    waiting = until(cluster, "queued", both_estimates, 60)
    p50, p90 = (datetime.fromisoformat(waiting[key]) for key in ("estimated_start", "estimated_start_p90"))
    assert waiting["state"] == "READY" and waiting["reason"] == "INSUFFICIENT_GPUS", waiting
    assert p50 <= p90, (p50, p90)
    shown = cli("status", "queued", run_dir=cluster).stdout
    assert "starts in ~" in shown and ", 90 %: within " in shown, shown
    listed = cli("jobs", "-o", "wide", run_dir=cluster).stdout.splitlines()
    row = next(line for line in listed if line.startswith("queued "))
    assert "(90%: " in row, listed

    placed = until(cluster, "queued", lambda j: j["state"] in ("SCHEDULED", "RUNNING", "SUCCEEDED"), HOLD_S + 90)
    scheduled = first_at(placed, "scheduled")
    since = [at - holder for at in (p50.timestamp(), p90.timestamp(), scheduled)]
    print("after the holder's placement: p50 {:.2f} s, p90 {:.2f} s, placed {:.2f} s".format(*since))
    assert scheduled <= p90.timestamp() + CLOCKS_S, (scheduled, p90.isoformat())
