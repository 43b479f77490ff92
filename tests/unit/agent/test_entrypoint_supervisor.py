"""The supervisor a job's own command runs under (``python -m shardyard.training.entry``), with tiny Python scripts as
real child processes: exit statuses, commands that cannot start, the lease, signals and the progress channel."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardyard.training import exitcodes
from shardyard.training.entry import Invocation, UsageError, exit_status, parse_args
from shardyard.training.exitcodes import ExitCause, classify_exit
from shardyard.training.lease import LEASE_FILE_ENV, LEASE_S_ENV, renew
from shardyard.training.preemption import STOP_SIGNAL
from tests.support import wait

PY = sys.executable


@pytest.mark.parametrize(
    ("returncode", "status", "cause"),
    [
        pytest.param(0, 0, ExitCause.OK, id="ok"),
        pytest.param(exitcodes.USER_ERROR, exitcodes.USER_ERROR, ExitCause.USER_ERROR, id="client-user-error"),
        pytest.param(exitcodes.PREEMPTED, exitcodes.PREEMPTED, ExitCause.PREEMPTED, id="client-preempted"),
        pytest.param(1, 1, ExitCause.PROCESS_EXIT, id="traceback"),
        pytest.param(2, 2, ExitCause.PROCESS_EXIT, id="argparse"),
        pytest.param(exitcodes.COMM_ERROR, exitcodes.INTERNAL_ERROR, ExitCause.PROCESS_EXIT, id="reserved-4"),
        pytest.param(exitcodes.INTERNAL_ERROR, exitcodes.INTERNAL_ERROR, ExitCause.PROCESS_EXIT, id="5"),
        pytest.param(exitcodes.OOM, exitcodes.INTERNAL_ERROR, ExitCause.PROCESS_EXIT, id="reserved-oom"),
        pytest.param(exitcodes.FENCED, exitcodes.INTERNAL_ERROR, ExitCause.PROCESS_EXIT, id="reserved-fenced"),
        pytest.param(exitcodes.DISK_FULL, exitcodes.INTERNAL_ERROR, ExitCause.PROCESS_EXIT, id="reserved-disk-full"),
        pytest.param(137, 137, ExitCause.KILLED, id="shell-killed"),
        pytest.param(255, 255, ExitCause.PROCESS_EXIT, id="255"),
        pytest.param(-signal.SIGKILL, 137, ExitCause.KILLED, id="sigkill"),
        pytest.param(-signal.SIGTERM, 143, ExitCause.KILLED, id="sigterm"),
    ],
)
def test_exit_status(returncode: int, status: int, cause: ExitCause) -> None:
    assert exit_status(returncode) == status
    assert classify_exit(status) is cause


@pytest.mark.parametrize(
    ("argv", "invocation"),
    [
        pytest.param(["--", "train"], Invocation(("train",)), id="command"),
        pytest.param(["--cwd", "/w", "--", "a", "--cwd", "--"], Invocation(("a", "--cwd", "--"), "/w"), id="verbatim"),
    ],
)
def test_parse_args(argv: list[str], invocation: Invocation) -> None:
    assert parse_args(argv) == invocation


@pytest.mark.parametrize("argv", [[], ["--"], ["train"], ["--cwd"], ["--shell", "--", "x"]], ids=str)
def test_parse_args_refuses(argv: list[str]) -> None:
    with pytest.raises(UsageError):
        parse_args(argv)


# --- the supervisor as a process -----------------------------------------------------------------------------------


def gone(pid: int) -> bool:
    """Exited (a zombie nobody reaped yet counts: it runs nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def eventually(condition: Callable[[], object], timeout_s: float = 20.0) -> None:
    wait.until(condition, "the supervisor's condition", timeout_s, every_s=0.02)


class Supervised:
    def __init__(self, tmp_path: Path, proc: subprocess.Popen[bytes], progress: int | None) -> None:
        self.tmp_path = tmp_path
        self.proc = proc
        self.progress = progress

    def log(self) -> str:
        return (self.tmp_path / "shard.log").read_text(errors="replace")

    def wait(self, timeout_s: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout_s)

    def pids(self) -> list[int]:
        """The pids the script wrote to ``pids`` (itself, then what it started), once it wrote them."""
        path = self.tmp_path / "pids"
        eventually(lambda: path.is_file() and path.read_text().endswith("\n"))
        return [int(p) for p in path.read_text().split()]


@pytest.fixture
def supervise(tmp_path: Path) -> Iterator[Callable[..., Supervised]]:
    """``supervise(script, cwd=None, env=None, args=None)``: start the supervisor as the agent does (stop signal
    blocked, a progress pipe, output to a log file) over ``python SCRIPT`` or ``args``."""
    started: list[Supervised] = []

    def start(
        script: str = "", *, cwd: str | None = None, env: dict[str, str] | None = None, args: list[str] | None = None
    ) -> Supervised:
        program = tmp_path / "script.py"
        program.write_text(textwrap.dedent(script))
        command = args if args is not None else [PY, str(program), str(tmp_path / "pids")]
        read_fd, write_fd = os.pipe()
        options = ["--cwd", cwd] if cwd is not None else []
        with open(tmp_path / "shard.log", "ab") as log:
            proc = subprocess.Popen(
                [PY, "-m", "shardyard.training.entry", *options, "--", *command],
                env={**os.environ, "SHARDYARD_PROGRESS_FD": str(write_fd), **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {STOP_SIGNAL}),
            )
        os.close(write_fd)
        started.append(Supervised(tmp_path, proc, read_fd))
        return started[-1]

    yield start
    for run in started:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
        if run.progress is not None:
            os.close(run.progress)
        path = tmp_path / "pids"
        for pid in [int(p) for p in path.read_text().split()] if path.is_file() else []:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


# Writes its pid and a grandchild's (a sleeping process in the script's group), then sleeps.
WITH_GRANDCHILD = """
    import os, subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(sys.argv[1], "w") as f:
        f.write(f"{os.getpid()} {grandchild.pid}\\n")
    time.sleep(120)
"""


@pytest.mark.parametrize(("code", "status"), [(0, 0), (3, 3), (75, 75), (1, 1), (9, 5)], ids=str)
def test_the_scripts_exit_status_comes_through(supervise: Callable[..., Supervised], code: int, status: int) -> None:
    run = supervise(f"import sys; sys.exit({code})")

    assert run.wait() == status, run.log()
    if code:
        assert f"the command exited with status {code}" in run.log()


def test_a_script_killed_by_a_signal_reads_as_killed(supervise: Callable[..., Supervised]) -> None:
    run = supervise("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")

    assert classify_exit(run.wait()) is ExitCause.KILLED
    assert "killed by SIGKILL" in run.log()


@pytest.mark.parametrize(
    ("name", "mode", "content"),
    [
        pytest.param("no-such-command-shardyard", None, None, id="not-on-path"),
        pytest.param("./missing.sh", None, None, id="no-such-file"),
        pytest.param("./not-executable.sh", 0o644, "#!/bin/sh\n", id="not-executable"),
        pytest.param("./garbage", 0o755, "\x01\x02 not a program", id="exec-format"),
    ],
)
def test_a_command_that_cannot_start_is_a_user_error(
    supervise: Callable[..., Supervised], tmp_path: Path, name: str, mode: int | None, content: str | None
) -> None:
    if content is not None and mode is not None:
        (tmp_path / name).write_text(content)
        (tmp_path / name).chmod(mode)
    run = supervise(args=[name, "--flag"], cwd=str(tmp_path))

    assert run.wait() == exitcodes.USER_ERROR
    assert classify_exit(exitcodes.USER_ERROR) is ExitCause.USER_ERROR
    assert f"cannot run {name!r} in {tmp_path}: " in run.log()
    if "/" not in name:
        assert "not found on PATH" in run.log()


def test_a_missing_working_dir_is_a_user_error(supervise: Callable[..., Supervised], tmp_path: Path) -> None:
    run = supervise("pass", cwd=str(tmp_path / "nowhere"))

    assert run.wait() == exitcodes.USER_ERROR
    assert f"working_dir {tmp_path / 'nowhere'} is not a directory" in run.log()


def test_the_script_runs_in_its_working_dir(supervise: Callable[..., Supervised], tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    run = supervise("import os; print('cwd', os.getcwd())", cwd=str(tmp_path / "code"))

    assert run.wait() == 0
    assert f"cwd {tmp_path / 'code'}" in run.log()


def test_the_progress_channel_reaches_the_script_and_ends_with_it(supervise: Callable[..., Supervised]) -> None:
    run = supervise("""
        import os
        os.write(int(os.environ["SHARDYARD_PROGRESS_FD"]), b'{"kind": "progress", "step": 1}\\n')
    """)
    assert run.progress is not None

    with os.fdopen(os.dup(run.progress), "rb") as channel:
        lines = channel.read()  # EOF: nobody holds the write end once the script is gone

    assert lines == b'{"kind": "progress", "step": 1}\n'
    assert run.wait() == 0


def test_a_lapsed_lease_kills_the_scripts_group_and_fences(
    supervise: Callable[..., Supervised], tmp_path: Path
) -> None:
    lease = tmp_path / "node.lease"
    renew(str(lease))
    run = supervise(WITH_GRANDCHILD, env={LEASE_FILE_ENV: str(lease), LEASE_S_ENV: "1.0"})
    while not (tmp_path / "pids").is_file():  # the agent is alive while the script starts
        renew(str(lease))
        time.sleep(0.05)
    pids = run.pids()
    renew(str(lease))
    silent_since = time.monotonic()  # the agent goes silent

    assert run.wait() == exitcodes.FENCED, run.log()

    assert time.monotonic() - silent_since < 1.0 + 2.0
    assert all(gone(pid) for pid in pids)
    assert "self-fenced: agent silent for" in run.log()


def test_sigterm_reaches_the_scripts_whole_group(supervise: Callable[..., Supervised]) -> None:
    run = supervise(WITH_GRANDCHILD)
    pids = run.pids()

    run.proc.terminate()

    assert run.wait() == 128 + signal.SIGTERM
    eventually(lambda: all(gone(pid) for pid in pids))


def test_leftovers_of_a_script_that_ended_are_killed(supervise: Callable[..., Supervised]) -> None:
    run = supervise("""
        import os, subprocess, sys
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        with open(sys.argv[1], "w") as f:
            f.write(f"{os.getpid()} {grandchild.pid}\\n")
    """)

    assert run.wait() == 0
    eventually(lambda: all(gone(pid) for pid in run.pids()))


def test_the_script_dies_with_its_supervisor(supervise: Callable[..., Supervised]) -> None:
    run = supervise(WITH_GRANDCHILD)
    script, _grandchild = run.pids()

    run.proc.kill()  # SIGKILL: nothing forwarded; PR_SET_PDEATHSIG does it
    run.wait()

    eventually(lambda: gone(script))


# Takes the stop signal half a second after it starts (as a script importing torch would), then exits as preempted
# once the flag is raised.
CLIENT_STOP = """
    import os, sys, time
    from shardyard.training.preemption import StopFlag
    with open(sys.argv[1], "w") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(0.5)
    flag = StopFlag.install()
    deadline = time.monotonic() + 30
    while not flag.requested and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(75 if flag.requested else 1)
"""


def test_a_stop_request_is_forwarded_and_held_until_the_script_takes_it(supervise: Callable[..., Supervised]) -> None:
    run = supervise(CLIENT_STOP)
    run.proc.send_signal(STOP_SIGNAL)  # at once: the supervisor holds it until the script exists

    assert run.wait() == exitcodes.PREEMPTED, run.log()


def test_a_stop_request_leaves_an_unmodified_script_running(supervise: Callable[..., Supervised]) -> None:
    run = supervise("""
        import os, sys, time
        with open(sys.argv[1], "w") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(1.0)
        print("finished")
    """)
    run.pids()

    run.proc.send_signal(STOP_SIGNAL)

    assert run.wait() == 0, run.log()
    assert "finished" in run.log()
