"""``shardyard submit --wait`` in a real terminal (a tmux pane, 80 and 200 columns) against a real local cluster: a
job that waits for its dataset, with a reason far wider than the pane, then runs once the dataset appears, then
succeeds. Read back from the screen: one progress line, never wider than the pane, and nothing left of an earlier
frame once the job runs; at the end, the bar's loss is the job's final loss."""

import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import wait
from tests.support.cluster import job, local_cluster
from tests.support.tmux import MISSING, TMUX, Tmux, tmux_server

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.skipif(TMUX is None, reason=MISSING)]

EXIT = "submit exited with "
REASON = "WAITING_FOR_ARTIFACT"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with local_cluster(tmp_path_factory.mktemp("cluster"), replicas=1) as run_dir:
        yield run_dir


def progress_lines(screen: list[str], job_id: str) -> list[str]:
    return [line for line in screen if line.startswith(f"{job_id} ")]


def one_fitting_line(screen: list[str], job_id: str, width: int) -> str:
    lines = progress_lines(screen, job_id)
    assert len(lines) == 1, screen
    assert len(lines[0]) < width, lines[0]
    return lines[0]


def until_screen(tmux: Tmux, shows: Callable[[list[str]], bool], what: str, timeout_s: float) -> list[str]:
    def probe() -> list[str] | None:
        screen = tmux.screen("submit")
        return screen if shows(screen) else None

    return wait.until(probe, what, timeout_s, describe=lambda: tmux.screen("submit"))


def arrive(source: Path, target: Path) -> None:
    """The dataset appears at ``target`` whole (copied beside it, then renamed into place)."""
    partial = target.with_name(target.name + ".partial")
    shutil.copytree(source, partial)
    os.rename(partial, target)


@pytest.mark.parametrize("width", [80, 200])
def test_submit_wait_draws_one_line_that_fits_the_terminal(width: int, cluster: Path, tmp_path: Path) -> None:
    job_id = f"tmux-{width}"
    document = json.loads(job(job_id, max_steps=60, sync_interval=20))
    document["dependencies"]["dataset"] = f"/data/datasets/late-{width}"
    submission = tmp_path / "job.json"
    submission.write_text(json.dumps(document))
    command = f"{sys.executable} -m shardyard.cli.main --run-dir {cluster} submit --wait {submission}"
    with tmux_server(tmp_path) as tmux:
        tmux.start("submit", width, f'{command}; echo "{EXIT}$?"')

        waiting = until_screen(
            tmux, lambda s: any(REASON in line for line in progress_lines(s, job_id)), "the waiting reason", 120
        )
        assert one_fitting_line(waiting, job_id, width).endswith("…"), waiting  # the reason, cut to the pane
        assert all(len(line) < width for line in waiting), waiting
        print(f"\n--- {width} columns, waiting ---\n" + "\n".join(waiting))

        arrive(cluster / "data" / "datasets" / "wikitext", cluster / "data" / "datasets" / f"late-{width}")
        running = until_screen(
            tmux, lambda s: any(f"{job_id} RUNNING " in line for line in s), "the job running on screen", 180
        )
        one_fitting_line(running, job_id, width)
        assert all(len(line) < width for line in running), running
        assert not any(REASON in line or "absent" in line for line in running), running
        print(f"--- {width} columns, running ---\n" + "\n".join(running))

        final = until_screen(tmux, lambda s: any(EXIT in line for line in s), "submit to exit", 300)
    print(f"--- {width} columns, at the end ---\n" + "\n".join(final))
    assert f"{EXIT}0" in final, final
    line = one_fitting_line(final, job_id, width)
    assert line.startswith(f"{job_id} SUCCEEDED ") and " step 60/60 " in line, line
    assert not any(REASON in row or "absent" in row for row in final), final
    shown = re.search(r" loss (\S+) syncs", line)
    final_loss = re.search(r"-> final (\S+) ", "\n".join(final))
    assert shown and final_loss and shown.group(1) == final_loss.group(1), final  # one final loss
