"""What the CLI says of a job waiting for its model or dataset: the missing paths, the nodes lacking each and where to
put it, and for the example job's data ``shardyard up --demo-data``, which makes that data before the agents start."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shardyard.cli import cluster, demo_data, render
from shardyard.cli.main import EXAMPLE, parser
from shardyard.errors import ClusterError
from shardyard.training import artifacts

ROOT = Path(__file__).parents[3]
MODEL, DATASET = demo_data.EXAMPLE_PATHS
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def missing(path: str, nodes: list[str], lacking: int, of: int, hosts: dict[str, str]) -> dict[str, Any]:
    return {"path": path, "nodes": nodes, "lacking": lacking, "of_nodes": of, "host_paths": hosts}


def waiting(*lacking: dict[str, Any]) -> dict[str, Any]:
    return {
        "job_id": "fine_tune_gpt2",
        "state": "READY",
        "reason": "WAITING_FOR_ARTIFACT",
        "message": "0/3 nodes can take the gang ...",
        "node_counts": {"model or dataset absent": 2, "GPU model mismatch": 1},
        "waiting_for": [m["path"] for m in lacking],
        "missing_artifacts": list(lacking),
    }


EVERY_NODE = {"node-0": "/run/data/models/gpt2_pretrained", "node-1": "/run/data/models/gpt2_pretrained"}


def test_the_detail_names_each_path_the_nodes_lacking_it_and_where_to_put_it() -> None:
    job = waiting(
        missing(MODEL, ["node-0", "node-1"], 2, 2, EVERY_NODE),
        missing(DATASET, ["node-1"], 1, 2, {"node-1": "/run/data/datasets/wikitext"}),
    )

    lines = render.job_detail(job, NOW).splitlines()

    assert lines[1:3] == [
        "  reason: WAITING_FOR_ARTIFACT: 0/3 nodes can take the gang ...",
        "    0/3 nodes: 2 model or dataset absent, 1 GPU model mismatch",
    ]
    assert lines[3:9] == [
        "    missing (the job starts once a node it could use has each of them):",
        f"    - {MODEL}: absent on every node it could use (node-0, node-1)",
        "      put it at /run/data/models/gpt2_pretrained on node-0, node-1",
        f"    - {DATASET}: absent on 1 of the 2 nodes it could use (node-1)",
        "      put it at /run/data/datasets/wikitext on node-1",
        "    put the files there, under the nodes' mount (agents run with --mounts /data=HOST_DIR): the job",
    ]
    assert "`shardyard up --demo-data`" in lines[-2] and "`shardyard demo`" in lines[-1]
    assert not any(line.startswith("    waiting for:") for line in lines)  # said above, with more


def test_many_nodes_are_counted_and_paths_mounted_apart_are_each_named() -> None:
    nodes = [f"node-{i}" for i in range(5)]
    hosts = {node: f"/mnt/{node}/x" if node == "node-4" else "/srv/x" for node in nodes}
    job = waiting(missing("/data/own/x", nodes, 40, 40, hosts))

    text = render.job_detail(job, NOW)

    assert (
        "- /data/own/x: absent on every node it could use (node-0, node-1, node-2, node-3, node-4 and 35 more)" in text
    )
    assert "put it at /mnt/node-4/x on node-4" in text
    assert "put it at /srv/x on node-0, node-1, node-2, node-3" in text
    assert "--demo-data" not in text  # not the example's data: the command would not make it


def test_a_path_no_node_mounts_is_said_so() -> None:
    text = render.job_detail(waiting(missing("/elsewhere/x", ["node-0"], 1, 1, {})), NOW)

    assert "no mount of those nodes holds this path: their agents never look for it" in text


def test_the_example_paths_are_the_example_jobs_and_where_the_demo_data_goes() -> None:
    for document in (ROOT / "examples" / "fine_tune_gpt2.json", EXAMPLE):
        dependencies = json.loads(document.read_text())["dependencies"]
        assert (dependencies["pretrained_model"], dependencies["dataset"]) == demo_data.EXAMPLE_PATHS
    assert (str(artifacts.DEMO_MODEL), str(artifacts.DEMO_DATASET)) == (demo_data.MODEL, demo_data.DATASET)


def test_up_makes_the_demo_data_only_when_asked() -> None:
    assert parser().parse_args(["up"]).demo_data is False
    assert parser().parse_args(["up", "--demo-data"]).demo_data is True


def test_the_demo_data_is_made_once_and_kept(tmp_path: Path) -> None:
    said: list[str] = []

    demo_data.provide(tmp_path, said.append)
    model = tmp_path / demo_data.MODEL / "model.safetensors"
    made_at = model.stat().st_mtime_ns
    demo_data.provide(tmp_path, said.append)

    assert said[0].startswith("demo data created: the example's model /data/models/gpt2_pretrained in ")
    assert f"{tmp_path / demo_data.DATASET}" in said[0]
    assert said[1].startswith("demo data kept:")
    assert model.stat().st_mtime_ns == made_at


def test_up_makes_the_demo_data_before_it_starts_anything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []

    def no_broker(*_args: object, **_options: object) -> None:
        raise ClusterError("stopped before the broker")

    monkeypatch.setattr(cluster, "start_broker", no_broker)
    with pytest.raises(ClusterError, match="stopped before the broker"):
        cluster.up(tmp_path / "run", data_root=tmp_path / "data", demo_data=True, say=said.append, supervise=False)

    assert (tmp_path / "data" / demo_data.DATASET / artifacts.DEMO_TEXT_FILE).is_file()
    assert said[0].startswith("demo data created:")
