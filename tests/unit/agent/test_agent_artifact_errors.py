"""One job's unusable path (5,000 characters, a NUL byte, outside the mounts, unreadable) is that job's artifact
error: the agent's heartbeat and artifact poll go on, and report the node's other artifacts as before."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shardyard.events import ArtifactErrorReason
from shardyard.node_agent.mounts import LocalDisk
from tests.unit.agent.test_agent_handlers import DATA, MODEL, Agent, accepted

LONG = "/data/datasets/" + "d" * (5000 - len("/data/datasets/"))
NUL = "/data/datasets/wiki\x00text"
ESCAPE = "/data/../etc"
UNMOUNTED = "/etc/ssl"
DENIED = "/data/datasets/locked"


class GuardedDisk(LocalDisk):
    """The real disk, but one directory may not be read (as a non-root user would see it; tests may run as root)."""

    def __init__(self, denied: Path) -> None:
        self.denied = denied

    def is_dir(self, path: Path) -> bool:
        if path == self.denied:
            raise PermissionError(13, "Permission denied", str(path))
        return super().is_dir(path)


def agent_on_the_real_disk(tmp_path: Path) -> Agent:
    agent = Agent(tmp_path)
    agent.inputs()  # MODEL and DATA are real directories under the /data mount
    (agent.root / "datasets" / "locked").mkdir()
    agent.handlers.disk = GuardedDisk(agent.root / "datasets" / "locked")
    return agent


async def test_bad_paths_are_errors_and_the_other_artifacts_are_still_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = agent_on_the_real_disk(tmp_path)
    caplog.set_level(logging.WARNING, logger="shardyard.node_agent.artifact_poller")

    await agent.handlers.on_lifecycle(accepted("good"))
    for index, bad in enumerate((LONG, NUL, ESCAPE, UNMOUNTED, DENIED)):
        await agent.handlers.on_lifecycle(accepted(f"bad-{index}", dataset=bad))
    await agent.handlers.poll_artifacts()
    await agent.handlers.heartbeat()
    await agent.handlers.heartbeat()

    beat = agent.beats()[-1]
    assert beat.artifacts == {MODEL: "local", DATA: "local"}
    reasons = {path: (error.reason, error.message) for path, error in beat.artifact_errors.items()}
    assert reasons == {
        LONG: (ArtifactErrorReason.UNREADABLE, "ENAMETOOLONG: File name too long"),
        NUL: (ArtifactErrorReason.NOT_SERVED, "the path contains a NUL byte"),
        ESCAPE: (ArtifactErrorReason.NOT_SERVED, "the path is not normalised (a '.', '..' or empty component)"),
        UNMOUNTED: (ArtifactErrorReason.NOT_SERVED, "not under a mount this node serves (/data)"),
        DENIED: (ArtifactErrorReason.UNREADABLE, "EACCES: Permission denied"),
    }
    assert [b.seq for b in agent.beats()][-2:] == [beat.seq - 1, beat.seq]  # both beats went out
    warned = [r.getMessage() for r in caplog.records if "counts as absent" in r.getMessage()]
    assert len(warned) == 5  # once per path, not per look
    assert all(len(line) < 400 for line in warned)  # the 5,000-character path is cut in the log


async def test_a_path_that_becomes_readable_loses_its_error_and_is_reported(tmp_path: Path) -> None:
    agent = agent_on_the_real_disk(tmp_path)
    await agent.handlers.on_lifecycle(accepted("locked", dataset=DENIED))
    assert set(agent.beats()[-1].artifact_errors) == {DENIED}  # a new error is a full heartbeat at once

    agent.handlers.disk = LocalDisk()  # the operator fixed the permissions
    await agent.handlers.heartbeat()

    beat = agent.beats()[-1]
    assert (beat.artifact_errors, beat.artifacts) == ({}, {MODEL: "local", DENIED: "local"})


async def test_a_path_is_not_looked_at_when_the_node_does_not_serve_it(tmp_path: Path) -> None:
    looked: list[Path] = []

    class Recording(LocalDisk):
        def is_dir(self, path: Path) -> bool:
            looked.append(path)
            return super().is_dir(path)

    agent = Agent(tmp_path)
    agent.handlers.disk = Recording()
    await agent.handlers.on_lifecycle(accepted("escape", model="/data/../etc/ssl", dataset=UNMOUNTED))
    await agent.handlers.heartbeat()

    assert looked == []
    assert set(agent.beats()[-1].artifact_errors) == {"/data/../etc/ssl", UNMOUNTED}
