from __future__ import annotations

import pytest

from shardyard.training import exitcodes
from shardyard.training.exitcodes import ExitCause, classify_exit, fault_exit_code, is_sync_timeout


@pytest.mark.parametrize(
    ("returncode", "cause"),
    [
        pytest.param(0, ExitCause.OK, id="ok"),
        pytest.param(3, ExitCause.USER_ERROR, id="user-error"),
        pytest.param(4, ExitCause.COMM_ERROR, id="comm-error"),
        pytest.param(75, ExitCause.PREEMPTED, id="preempted"),
        pytest.param(6, ExitCause.OOM, id="oom"),
        pytest.param(7, ExitCause.GPU_FAULT, id="gpu-fault"),
        pytest.param(8, ExitCause.SYNC_TIMEOUT, id="sync-timeout"),
        pytest.param(9, ExitCause.FENCED, id="fenced"),
        pytest.param(10, ExitCause.DISK_FULL, id="disk-full"),
        pytest.param(11, ExitCause.IO_ERROR, id="io-error"),
        pytest.param(5, ExitCause.PROCESS_EXIT, id="internal-error"),
        pytest.param(1, ExitCause.PROCESS_EXIT, id="python-traceback"),
        pytest.param(2, ExitCause.PROCESS_EXIT, id="usage"),
        pytest.param(-9, ExitCause.KILLED, id="sigkill-popen-even-by-the-oom-killer"),
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
    codes = (
        exitcodes.OK,
        exitcodes.USER_ERROR,
        exitcodes.COMM_ERROR,
        exitcodes.INTERNAL_ERROR,
        exitcodes.OOM,
        exitcodes.GPU_FAULT,
        exitcodes.SYNC_TIMEOUT,
        exitcodes.FENCED,
        exitcodes.DISK_FULL,
        exitcodes.IO_ERROR,
        exitcodes.PREEMPTED,
    )
    assert codes == (0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 75)
    assert [str(c) for c in ExitCause] == [
        *("ok", "user_error", "comm_error", "killed", "process_exit", "preempted"),
        *("oom", "gpu_fault", "sync_timeout", "fenced", "disk_full", "io_error"),
    ]


class OutOfMemoryError(RuntimeError):
    """Named like ``torch.cuda.OutOfMemoryError`` (recognised by name: the agent side imports no torch)."""


def _raised_from(outer: Exception, inner: BaseException) -> Exception:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except Exception as caught:
        return caught


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        pytest.param(MemoryError(), exitcodes.OOM, id="memory-error"),
        pytest.param(OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), exitcodes.OOM, id="cuda-oom"),
        pytest.param(
            RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"),
            exitcodes.OOM,
            id="cpu-allocator",
        ),
        pytest.param(
            RuntimeError("CUDA error: an illegal memory access was encountered"),
            exitcodes.GPU_FAULT,
            id="illegal-access",
        ),
        pytest.param(RuntimeError("CUDA error: uncorrectable ECC error encountered"), exitcodes.GPU_FAULT, id="ecc"),
        pytest.param(
            _raised_from(ValueError("parameter AllReduce failed"), OutOfMemoryError("out of memory")),
            exitcodes.OOM,
            id="oom-inside-a-collective",
        ),
        pytest.param(RuntimeError("Connection closed by peer"), None, id="comm"),
        pytest.param(ValueError("shape mismatch"), None, id="bug"),
    ],
)
def test_fault_exit_code(exc: BaseException, code: int | None) -> None:
    assert fault_exit_code(exc) == code


@pytest.mark.parametrize(
    ("message", "elapsed_s", "timed_out"),
    [
        pytest.param("[unbound_buffer.cc:78] Timed out waiting 30000ms for recv operation", 30.0, True, id="gloo"),
        pytest.param("Connection closed by peer [127.0.0.1]:4242", 0.01, False, id="peer-died"),
        pytest.param("Connection reset by peer", 29.5, True, id="failed-at-the-deadline"),
        pytest.param("Socket Timeout", 1.0, True, id="says-timeout"),
    ],
)
def test_is_sync_timeout(message: str, elapsed_s: float, timed_out: bool) -> None:
    assert is_sync_timeout(message, elapsed_s, timeout_s=30.0) is timed_out
