"""The command provider runs real scripts: arguments and environment in, node ids out; a failing or hanging script
is a ProviderError (the autoscaler counts it and goes on), never a crash."""

import stat
import time
from pathlib import Path

import pytest

from shardyard.autoscale.command import CommandProvider
from shardyard.autoscale.provider import ProviderError


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_add_passes_model_gpus_and_count_and_returns_the_printed_ids(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    add = script(
        tmp_path,
        "add",
        f'echo "$1 $2 $3 $SHARDYARD_GPU_MODEL $SHARDYARD_GPUS_PER_NODE $SHARDYARD_NODE_COUNT" > {seen}\n'
        "echo i-0001\necho i-0002\n",
    )
    provider = CommandProvider(add, script(tmp_path, "remove", "true\n"))
    assert provider.add("A100", 2, 2) == ["i-0001", "i-0002"]
    assert seen.read_text().split() == ["A100", "2", "2", "A100", "2", "2"]
    assert [(n.node_id, n.gpu_model, n.gpus) for n in provider.nodes()] == [
        ("i-0001", "A100", 2),
        ("i-0002", "A100", 2),
    ]


def test_a_script_that_prints_no_ids_gets_ids_of_its_own(tmp_path: Path) -> None:
    provider = CommandProvider(script(tmp_path, "add", "true\n"), script(tmp_path, "remove", "true\n"))
    assert provider.add("V100", 1, 2) == ["cmd-v100-1", "cmd-v100-2"]


def test_remove_passes_the_node_and_forgets_it(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    remove = script(tmp_path, "remove", f'echo "$1 $SHARDYARD_NODE_ID $SHARDYARD_GPU_MODEL" > {seen}\n')
    provider = CommandProvider(script(tmp_path, "add", "echo i-7\n"), remove)
    provider.add("A100", 1, 1)
    provider.remove("i-7")
    assert seen.read_text().split() == ["i-7", "i-7", "A100"]
    assert provider.nodes() == []


def test_a_failing_script_is_a_provider_error_that_quotes_it(tmp_path: Path) -> None:
    provider = CommandProvider(script(tmp_path, "add", "echo quota exceeded >&2\nexit 3\n"), "true")
    with pytest.raises(ProviderError, match="exited 3: quota exceeded"):
        provider.add("A100", 1, 1)
    assert provider.nodes() == []


def test_a_failed_removal_keeps_the_node(tmp_path: Path) -> None:
    provider = CommandProvider(script(tmp_path, "add", "echo i-1\n"), script(tmp_path, "remove", "exit 1\n"))
    provider.add("A100", 1, 1)
    with pytest.raises(ProviderError):
        provider.remove("i-1")
    assert [n.node_id for n in provider.nodes()] == ["i-1"]


def test_a_script_past_its_timeout_is_killed(tmp_path: Path) -> None:
    provider = CommandProvider(script(tmp_path, "add", "exec sleep 30\n"), "true", timeout_s=0.5)
    began = time.monotonic()
    with pytest.raises(ProviderError, match="timeout"):
        provider.add("A100", 1, 1)
    assert time.monotonic() - began < 5


def test_a_command_that_cannot_start_is_a_provider_error(tmp_path: Path) -> None:
    provider = CommandProvider(str(tmp_path / "absent"), "true")
    with pytest.raises(ProviderError, match="could not start"):
        provider.add("A100", 1, 1)
