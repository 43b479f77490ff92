"""The real launcher with tiny Python children: the stop signal is held for the runner's handler, never fatal; a
shard user's child runs as that user alone, still bound to the agent's life; a log tail quotes whole lines."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from shardyard.node_agent.launcher import LaunchSpec, SubprocessLauncher, tail
from shardyard.node_agent.shard_users import ShardUser
from shardyard.training.preemption import STOP_SIGNAL
from tests.support.cluster import reachable_by_shards, shard_users_unavailable

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


# Says who it runs as, whether the agent's death would take it along, and whether it can read a file of the agent's.
WHO_AM_I = textwrap.dedent(
    """
    import ctypes, json, os, sys
    signal = ctypes.c_int()
    ctypes.CDLL(None).prctl(2, ctypes.byref(signal), 0, 0, 0)  # PR_GET_PDEATHSIG
    umask = os.umask(0)
    try:
        open(sys.argv[1]).read()
        read = "read"
    except PermissionError:
        read = "PermissionError"
    print("a line for the log")
    os.write(int(os.environ["PROGRESS_FD"]), json.dumps(
        {"ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid()], "groups": os.getgroups(),
         "umask": umask, "pdeathsig": signal.value, "agent_file": read}).encode() + b"\\n")
    """
)


@pytest.mark.skipif(shard_users_unavailable() is not None, reason=str(shard_users_unavailable()))
async def test_a_shard_user_runs_the_child_without_the_agents_rights(tmp_path: Path) -> None:
    reachable_by_shards(tmp_path)
    secret = tmp_path / "agent-only"
    secret.write_text("x")
    secret.chmod(0o600)
    user = ShardUser(uid=231_234, gid=231_235)
    spec = replace(_spec(tmp_path, WHO_AM_I), argv=(sys.executable, "-c", WHO_AM_I, str(secret)), user=user)

    process = await SubprocessLauncher().launch(spec, progress_env="PROGRESS_FD")
    lines = [json.loads(line) async for line in process.progress()]

    assert await process.wait() == 0, spec.log_path.read_text()
    assert lines == [
        {
            "ids": [231_234, 231_234, 231_235, 231_235],
            "groups": [],
            "umask": 0o077,
            "pdeathsig": signal.SIGKILL,  # set after the switch, which would have cleared it
            "agent_file": "PermissionError",
        }
    ]
    log = os.stat(spec.log_path)
    assert (stat.S_IMODE(log.st_mode), log.st_uid) == (0o600, os.geteuid())  # the agent's, written through its fd
    assert "a line for the log" in spec.log_path.read_text()


def test_a_tail_never_quotes_a_line_cut_by_its_window(tmp_path: Path) -> None:
    log = tmp_path / "shard.log"
    log.write_text("hf_secret_value_123 " * 300 + "\nsecond\nlast\n")

    assert tail(log, max_bytes=64) == "second | last"
    log.write_text("one\ntwo\n")
    assert tail(log, max_bytes=4) == "two"  # the window starts a line: it is whole
    assert tail(log) == "one | two"
