"""The agent and its output disk: each heartbeat says how much room the disk job outputs and checkpoints map to has
left, and a shard's end is read as DISK_FULL or IO_ERROR when the runner says so (its exit code and its last report,
naming the path and the space left), when a script's last log lines show a storage error, or when a process exits
unexplained on a disk with (almost) nothing left."""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from shardyard.events import DiskSpace, FailureCause, Heartbeat, ShardFailed
from shardyard.node_agent import handlers as handlers_mod
from shardyard.node_agent.book import AgentBook
from shardyard.node_agent.disk import measure, storage_failure
from shardyard.training import exitcodes
from shardyard.training.exitcodes import ExitCause
from shardyard.training.storage import Space
from tests.unit.agent.test_agent_handlers import Agent
from tests.unit.builders import assignment, at, workload

C = FailureCause
EMPTY = Space(4096, 64 << 20)
ROOMY = Space(40 << 20, 64 << 20)
RUNNER_SAID = {"kind": "failed", "cause": "DISK_FULL", "message": "no space left on device (ENOSPC) on /s/x: 0B free"}
TRACEBACK = "exit code 1: Traceback (most recent call last): | OSError: [Errno 28] No space left on device: '/s/o.bin'"


@pytest.mark.parametrize(
    ("exit_cause", "message", "final", "space", "expected"),
    [
        pytest.param(
            ExitCause.DISK_FULL,
            "exit code 10: ",
            RUNNER_SAID,
            EMPTY,
            (C.DISK_FULL, "exit code 10: no space left on device (ENOSPC) on /s/x: 0B free"),
            id="the-runner-says-where",
        ),
        pytest.param(
            ExitCause.IO_ERROR, "exit code 11: | EIO", {}, None, (C.IO_ERROR, "exit code 11: | EIO"), id="runner-eio"
        ),
        pytest.param(
            ExitCause.PROCESS_EXIT,
            TRACEBACK,
            {},
            ROOMY,
            (C.DISK_FULL, f"no space left on device on /s/o.bin: 40MiB free of 64MiB; {TRACEBACK}"),
            id="a-scripts-traceback",
        ),
        pytest.param(
            ExitCause.PROCESS_EXIT,
            "exit code 1: ",
            {},
            EMPTY,
            (C.DISK_FULL, "the output disk was full when it exited (4KiB free of 64MiB); exit code 1: "),
            id="silent-on-a-full-disk",
        ),
        pytest.param(ExitCause.PROCESS_EXIT, "exit code 1: ", {}, ROOMY, None, id="silent-with-room"),
        pytest.param(ExitCause.PROCESS_EXIT, "exit code 1: boom", {}, None, None, id="not-measured"),
        pytest.param(ExitCause.KILLED, "exit code -9: ", {}, EMPTY, None, id="killed-stays-killed"),
        pytest.param(ExitCause.OOM, TRACEBACK, {}, EMPTY, None, id="a-classified-exit-stays"),
    ],
)
def test_what_a_shards_end_says_about_its_disk(
    exit_cause: ExitCause,
    message: str,
    final: Mapping[str, object],
    space: Space | None,
    expected: tuple[FailureCause, str] | None,
) -> None:
    assert storage_failure(exit_cause, 10, message, final, space) == expected


def test_the_book_reports_a_full_disk_with_the_runners_words() -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())

    event = book.finished(
        ("job-1", 0, 1), exitcodes.DISK_FULL, now=at(3), final=RUNNER_SAID, message="exit code 10: ", space=EMPTY
    )

    assert isinstance(event, ShardFailed)
    assert (event.cause, event.exit_code) == (C.DISK_FULL, exitcodes.DISK_FULL)
    assert event.message == "exit code 10: no space left on device (ENOSPC) on /s/x: 0B free"


def test_the_output_disk_is_measured_through_the_mounts(tmp_path: Path) -> None:
    found = measure("/data/checkpoints", {"/data": str(tmp_path)})
    statvfs = os.statvfs(tmp_path)

    assert found is not None and found.path == "/data/checkpoints"
    assert found.total_bytes == statvfs.f_blocks * statvfs.f_frsize
    assert 0 < found.free_bytes <= found.total_bytes


async def test_a_heartbeat_carries_the_output_disk(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    (tmp_path / "data").mkdir()

    await agent.handlers.heartbeat()

    (beat,) = agent.bus.of(Heartbeat)
    assert isinstance(beat.output_disk, DiskSpace) and beat.output_disk.path == "/data/checkpoints"
    assert beat.output_disk.total_bytes > 0


async def test_a_script_that_dies_on_a_full_disk_fails_disk_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(tmp_path)
    agent.inputs()
    measured: list[Path] = []

    def full(path: Path) -> Space:
        measured.append(path)
        return EMPTY

    monkeypatch.setattr(handlers_mod, "free_space", full)
    await agent.handlers.on_assignment(assignment())
    (spec,) = agent.launcher.specs
    spec.log_path.write_text(f"OSError: [Errno {errno.ENOSPC}] No space left on device: '/srv/out/model.bin'\n")

    agent.launcher.processes[0].end(1)
    (event,) = await agent.until(lambda: agent.bus.of(ShardFailed))

    assert measured == [tmp_path / "data" / "checkpoints" / "job-1"]  # the shard's output directory
    assert event.cause is C.DISK_FULL
    assert event.message.startswith("no space left on device on /srv/out/model.bin: 4KiB free of 64MiB; exit code 1")


@pytest.mark.parametrize(
    ("shared", "there", "resumes"),
    [
        pytest.param((), False, False, id="not-on-this-nodes-own-disk-starts-over"),
        pytest.param((), True, True, id="on-this-nodes-disk-resumes"),
        pytest.param(("/data",), False, True, id="missing-on-a-shared-mount-stays-missing"),
    ],
)
async def test_a_checkpoint_another_nodes_own_disk_holds_is_not_waited_for(
    tmp_path: Path, shared: tuple[str, ...], there: bool, resumes: bool
) -> None:
    agent = Agent(tmp_path, shared=shared)
    agent.inputs()
    if there:
        (agent.root / "checkpoints/job-1/checkpoint").mkdir(parents=True)

    await agent.handlers.on_assignment(assignment(workload=workload(resume_from="/data/checkpoints/job-1/checkpoint")))

    if resumes and not there:  # the launch refused: the checkpoint is missing for every node
        (event,) = await agent.until(lambda: agent.bus.of(ShardFailed))
        assert event.cause is C.MISSING_ARTIFACT
        return
    (spec,) = agent.launcher.specs
    assert ("SHARDYARD_RESUME_DIR" in spec.env) is resumes
    agent.launcher.processes[0].end(0)
    await agent.until(lambda: not agent.handlers.tasks)
