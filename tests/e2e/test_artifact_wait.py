"""A new user's first run, on a real local cluster: ``shardyard up`` without data, then the README's example job.
The job waits, and says for what: both of its paths, the nodes lacking them and where on their disk they go, in
``status`` (with how to make the example's data) and in ``submit --wait``'s progress. ``shardyard up --demo-data``
makes that data before its agents start, and the same job gets past the wait."""

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import EXAMPLE, ONE_REPLICA, ROOT, cli, job, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.broker]

EXAMPLE_FILE = str(ROOT / "examples" / "fine_tune_gpt2.json")
PATHS = (EXAMPLE["dependencies"]["pretrained_model"], EXAMPLE["dependencies"]["dataset"])
A100S = ("node-0", "node-1")
"""The default nodes' A100s (node-2's V100s are not of the example's kind)."""


def shown(run_dir: Path, job_id: str) -> dict[str, Any]:
    answer = cli("status", job_id, "--json", run_dir=run_dir, timeout=30)
    return dict(json.loads(answer.stdout)) if answer.returncode == 0 else {}


def up(run_dir: Path, *args: str) -> str:
    started = cli("up", *ONE_REPLICA, *args, run_dir=run_dir, timeout=240)
    assert started.returncode == 0, started.stdout + started.stderr
    return started.stdout


def down(run_dir: Path) -> None:
    stopped = cli("down", run_dir=run_dir, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def test_without_data_the_example_waits_naming_both_paths_the_nodes_and_where_to_put_them(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    up(run_dir)
    try:
        submitted = cli("submit", EXAMPLE_FILE, run_dir=run_dir, timeout=60)
        assert submitted.returncode == 0, submitted.stderr
        job_id = EXAMPLE["task_id"]

        def waiting() -> dict[str, Any] | None:
            view = shown(run_dir, job_id)
            lacking = view.get("missing_artifacts") or []
            named = all(tuple(m["nodes"]) == A100S for m in lacking) and len(lacking) == 2
            return view if view.get("reason") == "WAITING_FOR_ARTIFACT" and named else None

        view = wait_for(
            "the example to wait for both its paths on both A100s", waiting, 60, lambda: shown(run_dir, job_id)
        )
        data = (run_dir / "data").resolve()
        assert view["state"] == "READY"
        assert view["waiting_for"] == list(PATHS)
        for path, lacking in zip(PATHS, view["missing_artifacts"], strict=True):
            assert (lacking["path"], lacking["lacking"], lacking["of_nodes"]) == (path, 2, 2)
            where = str(data / Path(path).relative_to("/data"))
            assert lacking["host_paths"] == dict.fromkeys(A100S, where)
            assert f"{path} absent on every node it could use (node-0, node-1): put it at {where}" in view["message"]

        detail = cli("status", job_id, run_dir=run_dir, timeout=30).stdout
        assert f"- {PATHS[0]}: absent on every node it could use (node-0, node-1)" in detail
        assert f"put it at {data}/datasets/wikitext on node-0, node-1" in detail
        assert "`shardyard up --demo-data`" in detail

        # The progress of `submit --wait` (one line per change off a terminal) says the same, before it gives up.
        followed = cli("submit", "-", "--wait", "--timeout", "20", run_dir=run_dir, stdin=job("second-try"), timeout=90)
        assert followed.returncode != 0  # it never ends: it waits
        assert "WAITING_FOR_ARTIFACT: 0/3 nodes can take the gang" in followed.stdout, followed.stdout
        assert f"{PATHS[1]} absent on every node it could use (node-0, node-1): put it at" in followed.stdout
    finally:
        down(run_dir)


def test_up_with_demo_data_makes_it_before_the_agents_start_and_the_example_gets_past_the_wait(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    said = up(run_dir, "--demo-data", "--node", "A100:1", "--node", "A100:1")
    try:
        data = (run_dir / "data").resolve()
        assert f"demo data created: the example's model {PATHS[0]} in {data}/models/gpt2_pretrained" in said, said
        assert (data / "models" / "gpt2_pretrained" / "config.json").is_file()
        assert (data / "datasets" / "wikitext" / "train.txt").is_file()
        made = said.index("demo data created")
        assert made < said.index("cluster ready")

        submitted = cli("submit", "-", run_dir=run_dir, stdin=job("with-demo-data", max_steps=20), timeout=60)
        assert submitted.returncode == 0, submitted.stderr

        def placed() -> dict[str, Any] | None:
            view = shown(run_dir, "with-demo-data")
            return view if view.get("placements") else None

        view = wait_for("the job to be placed", placed, 60, lambda: shown(run_dir, "with-demo-data"))
        assert {p["node_id"] for p in view["placements"]} == {"node-0", "node-1"}
        assert (view["missing_artifacts"], view["waiting_for"]) == ([], [])
    finally:
        down(run_dir)
