"""The README's demo command, end to end: S15 example on two simulated A100s to SUCCEEDED."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.broker]


def test_demo(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "shardyard.cli.main", "demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "job fine_tune_gpt2: SUCCEEDED" in out
    syncs = [int(n) for n in re.findall(r"sync (\d+) at step", out)]
    assert max(syncs) >= 3
    placed = re.search(r"scheduled\s+attempt 1: (.*); coordinator", out)
    assert placed and placed.group(1).count("node-") == 2
    first, final = map(float, re.search(r"loss: first ([\d.e+-]+) -> final ([\d.e+-]+)", out).groups())  # type: ignore[union-attr]
    assert final < first
    # One final loss: the progress bar's last line, rank 0's row, the timeline, the loss curve's end and the summary.
    shown = {
        "bar": re.findall(r"^fine_tune_gpt2 SUCCEEDED .* loss (\S+) syncs", out, re.M)[-1],
        "shard 0": re.findall(r"shard 0 on \S+: COMPLETED step 300 loss (\S+) ", out)[-1],
        "timeline": re.findall(r"succeeded\s+final loss (\S+);", out)[-1],
        "curve": re.findall(r"^  step +300  loss +(\S+) ", out, re.M)[-1],
    }
    assert set(shown.values()) == {f"{final:.4g}"}, (shown, out)
    assert not (tmp_path / ".shardyard" / "cluster.json").exists()
