"""Storage faults in the training runtime: which errors are a full or failing disk (by errno, through the chain of
causes, or in a script's log lines), the free space left where a write failed, and what the runner and the checkpoint
writer do with one: exit DISK_FULL or IO_ERROR naming the path over the progress pipe, and stop training on a disk
that can hold nothing more."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch

from shardyard.training import checkpoint as checkpoint_mod
from shardyard.training import exitcodes, model, runner
from shardyard.training.checkpoint import CheckpointWriter, TrainingState, checkpoint_files
from shardyard.training.config import RunConfig
from shardyard.training.errors import CommError
from shardyard.training.model import CheckpointError, TinyGPT, TinyGPTConfig, write_dir_atomic
from shardyard.training.preemption import StopFlag
from shardyard.training.progress import ProgressReporter
from shardyard.training.storage import (
    Space,
    StorageFault,
    describe,
    fault_in_text,
    fault_of,
    free_space,
    nearly_full,
)
from tests.unit.training.test_training_config import GOOD_ENV

F = StorageFault


def raised_from(outer: Exception, inner: BaseException) -> Exception:
    outer.__cause__ = inner
    return outer


@pytest.mark.parametrize(
    ("exc", "fault"),
    [
        pytest.param(OSError(errno.ENOSPC, "No space left on device", "/o/m"), F.DISK_FULL, id="enospc"),
        pytest.param(OSError(errno.EDQUOT, "Disk quota exceeded"), F.DISK_FULL, id="quota"),
        pytest.param(OSError(errno.EIO, "Input/output error"), F.IO_ERROR, id="eio"),
        pytest.param(OSError(errno.EROFS, "Read-only file system"), F.IO_ERROR, id="remounted-read-only"),
        pytest.param(raised_from(CheckpointError("cannot save"), OSError(errno.ENOSPC, "x")), F.DISK_FULL, id="chain"),
        pytest.param(PermissionError(errno.EACCES, "Permission denied"), None, id="eacces-is-not-the-disk"),
        pytest.param(FileNotFoundError(errno.ENOENT, "No such file"), None, id="enoent"),
        pytest.param(RuntimeError("No space left on device"), None, id="words-without-an-errno"),
    ],
)
def test_which_errors_are_storage_faults(exc: BaseException, fault: StorageFault | None) -> None:
    found = fault_of(exc)

    assert (found[0] if found else None) is fault


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "Traceback (most recent call last): | OSError: [Errno 28] No space left on device: '/srv/o/x.bin' | done",
            (F.DISK_FULL, "/srv/o/x.bin"),
            id="python-names-the-path",
        ),
        pytest.param("OSError: [Errno 5] Input/output error", (F.IO_ERROR, None), id="python-without-a-path"),
        pytest.param(
            "[Errno 2] No such file or directory: '/x' | [Errno 122] Disk quota exceeded",
            (F.DISK_FULL, None),
            id="first-of-the-disk",
        ),
        pytest.param("cp: error writing 'a': No space left on device", (F.DISK_FULL, None), id="strerror"),
        pytest.param("tee: out.log: Read-only file system", (F.IO_ERROR, None), id="read-only"),
        pytest.param("[Errno 2] No such file or directory: '/x'", None, id="another-errno"),
        pytest.param("loss 1.23", None, id="nothing"),
    ],
)
def test_a_scripts_log_lines_tell_a_storage_fault(text: str, expected: tuple[StorageFault, str | None] | None) -> None:
    assert fault_in_text(text) == expected


def test_free_space_is_measured_on_the_nearest_directory_that_exists(tmp_path: Path) -> None:
    space = free_space(tmp_path / "not" / "made" / "yet")

    assert space is not None and 0 <= space.free_bytes <= space.total_bytes
    assert space == free_space(tmp_path)


def test_a_message_names_the_error_the_path_and_the_space_left() -> None:
    error = OSError(errno.ENOSPC, "No space left on device", "/srv/out/model.safetensors")

    said = describe(F.DISK_FULL, error, "/srv/out/model.safetensors", Space(512, 64 << 20))

    assert said == "no space left on device (ENOSPC) on /srv/out/model.safetensors: 512B free of 64MiB"
    assert nearly_full(Space(512, 64 << 20)) and not nearly_full(Space(2 << 20, 64 << 20)) and not nearly_full(None)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        pytest.param(OSError(errno.ENOSPC, "No space left on device", "/out/ckpt/x"), exitcodes.DISK_FULL, id="full"),
        pytest.param(OSError(errno.EIO, "Input/output error", "/out/ckpt/x"), exitcodes.IO_ERROR, id="eio"),
        pytest.param(
            raised_from(CommError("gather failed"), OSError(errno.EIO, "Input/output error")),
            exitcodes.COMM_ERROR,
            id="a-collectives-eio-is-communication",
        ),
    ],
)
def test_the_runner_exits_for_a_full_or_failing_disk_and_says_where_over_the_progress_pipe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], exc: Exception, code: int
) -> None:
    def failing(cfg: RunConfig, reporter: ProgressReporter, stop: StopFlag, term: object = None) -> runner.Outcome:
        raise exc

    monkeypatch.setattr(runner, "train", failing)
    read, write = os.pipe()

    assert runner.main({**GOOD_ENV, "SHARDYARD_PROGRESS_FD": str(write)}, stop=StopFlag()) == code

    with os.fdopen(read) as pipe:
        reports = [json.loads(line) for line in pipe]
    failed = [r for r in reports if r["kind"] == "failed"]
    if code == exitcodes.COMM_ERROR:
        assert failed == []
        return
    (report,) = failed
    assert report["cause"] == ("DISK_FULL" if code == exitcodes.DISK_FULL else "IO_ERROR")
    assert (
        report["message"].startswith(f"{os.strerror(exc.errno).lower()} (") and " on /out/ckpt/x: " in report["message"]
    )
    assert " free of " in report["message"]  # measured on the nearest directory that exists: /
    assert report["message"] in capsys.readouterr().err


def test_a_failed_write_names_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")  # as os.fsync raises it: no file named

    monkeypatch.setattr(model.os, "fsync", failing_fsync)

    with pytest.raises(OSError) as raised:
        write_dir_atomic(tmp_path / "ckpt", {"a.bin": b"x"})

    assert raised.value.errno == errno.EIO
    assert raised.value.filename is not None and raised.value.filename.endswith("a.bin")
    assert not list(tmp_path.glob(".ckpt.tmp-*"))  # the half-written copy went; nothing replaced


def trained() -> tuple[TinyGPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = TinyGPT(TinyGPTConfig(n_positions=16, n_embd=8, n_layer=1, n_head=2))
    return net, torch.optim.AdamW(net.parameters(), lr=1e-2)


def test_a_checkpoint_on_a_full_disk_stops_training_at_the_next_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    net, optimizer = trained()
    writer = CheckpointWriter(tmp_path / "ckpt", lambda step, d, ms: None)

    def disk_full(directory: object, files: object) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device", f"{directory}/model.safetensors")

    monkeypatch.setattr(checkpoint_mod, "write_dir_atomic", disk_full)
    writer.submit(10, checkpoint_files(net, optimizer, TrainingState(10, 1.0, 1, 7, 10)))
    writer.wait()

    with pytest.raises(OSError) as raised:
        writer.check()
    writer.close()

    assert raised.value.errno == errno.ENOSPC and "model.safetensors" in str(raised.value.filename)
    assert not (tmp_path / "ckpt").exists()
