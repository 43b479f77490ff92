"""The README's demo command, end to end: S15 example on two simulated A100s to SUCCEEDED."""

import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.broker]


SILENCE_S = 30.0
"""The longest the demo may go without a line: it was silent twice for about 2 minutes (issue 33), while its cluster
started and while its job's first step came."""


def run_demo(cwd: Path) -> tuple[int, str, list[tuple[float, str]]]:
    """``shardyard demo`` from ``cwd``: its exit status, its output, and each line with when it came."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "shardyard.cli.main", "demo"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert demo.stdout is not None
    lines = [(time.monotonic(), "")]
    for line in demo.stdout:  # each line as it comes, with when
        lines.append((time.monotonic(), line))
    demo.wait(timeout=60)
    return demo.returncode, "".join(line for _at, line in lines), lines


def test_demo(tmp_path: Path) -> None:
    code, out, lines = run_demo(tmp_path)
    assert code == 0, out
    times = [at for at, _line in lines]
    gaps = sorted(((b - a), lines[i + 1][1].strip()) for i, (a, b) in enumerate(itertools.pairwise(times)))
    assert gaps[-1][0] < SILENCE_S, f"silent for {gaps[-1][0]:.0f} s before: {gaps[-1][1]}"
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
    assert not (tmp_path / ".shardyard-demo" / "cluster.json").exists()  # the demo's own folder, left stopped
    assert not (tmp_path / ".shardyard").exists()  # never the folder of a cluster the user starts

    # The first thing everyone does: the demo again. It runs the example again, afresh (it answered with the last
    # run's job, refused as a DUPLICATE_JOB, when its folder kept the broker's log).
    code, again, _lines = run_demo(tmp_path)
    assert code == 0, again
    assert "accepted fine_tune_gpt2 into queue default" in again and "DUPLICATE_JOB" not in again, again
    assert re.search(r"scheduled\s+attempt 1: ", again), again
