"""The real launcher with tiny Python children: the stop signal is held for the runner's handler, never fatal."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from shardyard.node_agent.launcher import LaunchSpec, SubprocessLauncher
from shardyard.training.preemption import STOP_SIGNAL

# Sends itself the stop signal before it has a handler (as when a stop request beats a slow torch import), then
# installs the runner's flag and says what it saw on the progress channel.
EARLY_STOP = textwrap.dedent(
    """
    import os
    from shardyard.training.preemption import STOP_SIGNAL, StopFlag
    os.kill(os.getpid(), STOP_SIGNAL)
    flag = StopFlag.install()
    os.write(int(os.environ["PROGRESS_FD"]), f"requested={flag.requested}\\n".encode())
    """
)


def _spec(tmp_path: Path, program: str) -> LaunchSpec:
    return LaunchSpec(argv=(sys.executable, "-c", program), env={}, cwd=tmp_path, log_path=tmp_path / "child.log")


async def test_a_stop_signal_before_the_handler_waits_for_it(tmp_path: Path) -> None:
    process = await SubprocessLauncher().launch(_spec(tmp_path, EARLY_STOP), progress_env="PROGRESS_FD")

    lines = [line async for line in process.progress()]

    assert await process.wait() == 0, (tmp_path / "child.log").read_text()
    assert lines == [b"requested=True\n"]


async def test_signalling_an_exited_process_is_harmless(tmp_path: Path) -> None:
    process = await SubprocessLauncher().launch(_spec(tmp_path, "pass"), progress_env="PROGRESS_FD")
    assert await process.wait() == 0

    process.signal(STOP_SIGNAL)
    process.terminate()
    process.kill()
