"""Walking-skeleton latencies on a local cluster (prints JSON).

For each run: ``shardyard up`` to ready, then the S15 example job: submission -> accepted -> scheduled -> every
shard started -> first training step, and the whole demo path (up + job + down) wall time.

    python bench/skeleton.py [--runs 3] [--steps N] [--smoke]
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from shardyard.cli import client, cluster
from shardyard.training.artifacts import create_demo_artifacts
from smoke import parse_args

EXAMPLE = Path(__file__).parents[1] / "examples" / "fine_tune_gpt2.json"
SMOKE = {"runs": 1, "steps": 5}


def _at(entry: dict[str, Any]) -> float:
    return datetime.fromisoformat(entry["at"]).timestamp()


def job_document(steps: int | None) -> bytes:
    """The example job, training ``steps`` steps (None: as many as the example says, the runner's default)."""
    if steps is None:
        return EXAMPLE.read_bytes()
    return json.dumps({**json.loads(EXAMPLE.read_text()), "training": {"max_steps": steps}}).encode()


def one_run(root: Path, steps: int | None) -> dict[str, float]:
    data = root / "data"
    create_demo_artifacts(data)
    began = time.monotonic()
    info = cluster.up(root / "run", data_root=data, say=lambda _m: None)
    ready = time.monotonic()
    try:
        submitted_at = time.time()
        submitted = client.submit(info.bootstrap, job_document(steps))
        final = client.wait(info.monitor_url, submitted.job_id, timeout_s=600, on_update=lambda _j: None)
        job = client.job(info.monitor_url, submitted.job_id) or final
    finally:
        cluster.down(root / "run", say=lambda _m: None)
    ended = time.monotonic()
    if job["state"] != "SUCCEEDED":
        raise SystemExit(f"the job ended {job['state']}: {job.get('message')}")
    events = {e["event"]: _at(e) for e in reversed(job["timeline"])}  # first occurrence of each
    first_step = datetime.fromisoformat(job["first_step_at"]).timestamp()
    return {
        "up_to_ready_s": ready - began,
        "submit_to_accepted_s": events["accepted"] - submitted_at,
        "submit_to_scheduled_s": events["scheduled"] - submitted_at,
        "submit_to_running_s": events["running"] - submitted_at,
        "submit_to_first_step_s": first_step - submitted_at,
        "job_wall_s": _at(job["timeline"][-1]) - submitted_at,
        "demo_wall_s": ended - began,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, help="the job's max_steps (default: the example's)")
    args = parse_args(parser, SMOKE)
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="shardyard-bench-") as tmp:
            runs.append(one_run(Path(tmp), args.steps))
    summary = {
        key: {
            "median": round(statistics.median(r[key] for r in runs), 3),
            "min": round(min(r[key] for r in runs), 3),
            "max": round(max(r[key] for r in runs), 3),
        }
        for key in runs[0]
    }
    json.dump({"benchmark": "skeleton", "runs": args.runs, "results": summary}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
