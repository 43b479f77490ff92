"""A whole local cluster on real GPUs (skipped without CUDA): the node agent's inventory comes from NVML, not from
its declared simulated GPUs, and a job asking for that GPU model is placed there and trains on ``cuda:0`` over
NCCL to SUCCEEDED."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.cluster import EXAMPLE, cli, wait_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.broker,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a GPU and its driver)"),
]


def _nodes(run_dir: Path) -> list[dict[str, Any]]:
    answer = cli("nodes", "-o", "json", run_dir=run_dir, timeout=30)
    return list(json.loads(answer.stdout)["nodes"]) if answer.returncode == 0 else []


def test_a_cluster_on_nvml_gpus_runs_a_job_on_cuda_to_success(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # The declared inventory is a V100 on purpose: NVML finds the real GPUs, and the agent must report those.
    started = cli("up", "--replicas", "1", "--demo-data", "--node", "V100:1", run_dir=run_dir, timeout=240)
    assert started.returncode == 0, started.stdout + started.stderr
    try:

        def real_node() -> dict[str, Any] | None:
            nodes = [n for n in _nodes(run_dir) if n["status"] == "ALIVE" and n["gpus"]]
            return nodes[0] if nodes else None

        node = wait_for("the agent's node ALIVE with its GPUs", real_node, 60, lambda: _nodes(run_dir))
        gpus = node["gpus"]
        assert len(gpus) == torch.cuda.device_count()
        assert not any(g["simulated"] for g in gpus), gpus
        model = gpus[0]["model"]
        assert model != "V100" or "V100" in torch.cuda.get_device_name(0), gpus
        assert all(g["memory_bytes"] > 1024**3 for g in gpus), gpus

        document = json.loads(json.dumps(EXAMPLE))
        document.update(task_id="on-real-gpus", shard_count=len(gpus), sync_interval=5)
        document["resource_requirements"]["gpu"] = {
            "count": len(gpus),
            "model": model,
            "min_flops": gpus[0]["tflops"],
        }
        document["training"] = {"max_steps": 60}
        submitted = cli(
            "submit",
            "-",
            "--wait",
            "--timeout",
            "300",
            run_dir=run_dir,
            stdin=json.dumps(document).encode(),
            timeout=360,
        )
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        assert "on-real-gpus: SUCCEEDED" in submitted.stdout, submitted.stdout

        logs = "\n".join(p.read_text(errors="replace") for p in run_dir.rglob("*.log") if "on-real-gpus" in str(p))
        assert "training on cuda:0 over nccl" in logs, logs[-4000:]
    finally:
        stopped = cli("down", run_dir=run_dir, timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
