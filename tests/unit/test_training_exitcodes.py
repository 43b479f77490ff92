from __future__ import annotations

import pytest

from shardyard.training import exitcodes
from shardyard.training.exitcodes import ExitCause, classify_exit


@pytest.mark.parametrize(
    ("returncode", "cause"),
    [
        pytest.param(0, ExitCause.OK, id="ok"),
        pytest.param(3, ExitCause.USER_ERROR, id="user-error"),
        pytest.param(4, ExitCause.COMM_ERROR, id="comm-error"),
        pytest.param(75, ExitCause.PREEMPTED, id="preempted"),
        pytest.param(5, ExitCause.PROCESS_EXIT, id="internal-error"),
        pytest.param(1, ExitCause.PROCESS_EXIT, id="python-traceback"),
        pytest.param(2, ExitCause.PROCESS_EXIT, id="usage"),
        pytest.param(-9, ExitCause.KILLED, id="sigkill-popen"),
        pytest.param(-15, ExitCause.KILLED, id="sigterm-popen"),
        pytest.param(-6, ExitCause.KILLED, id="sigabrt-popen"),
        pytest.param(137, ExitCause.KILLED, id="sigkill-shell"),
        pytest.param(143, ExitCause.KILLED, id="sigterm-shell"),
        pytest.param(128, ExitCause.PROCESS_EXIT, id="128-is-not-a-signal"),
        pytest.param(255, ExitCause.PROCESS_EXIT, id="255"),
    ],
)
def test_classify_exit(returncode: int, cause: ExitCause) -> None:
    assert classify_exit(returncode) is cause


def test_exit_code_values_are_stable() -> None:
    codes = (exitcodes.OK, exitcodes.USER_ERROR, exitcodes.COMM_ERROR, exitcodes.INTERNAL_ERROR, exitcodes.PREEMPTED)
    assert codes == (0, 3, 4, 5, 75)
    assert [str(c) for c in ExitCause] == ["ok", "user_error", "comm_error", "killed", "process_exit", "preempted"]
