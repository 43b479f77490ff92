"""Who runs the local cluster's shards: each job's own user (the agents' default) unless the operator chose, or the
agents run as root with a Python other users cannot run; then they run as the agent, and ``up`` says so."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from shardyard.cli import shard_user


@pytest.fixture
def root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)


def test_a_python_others_can_run_keeps_the_agents_default(root: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shard_user, "interpreter_blocked", lambda: None)
    said: list[str] = []

    assert shard_user.shard_user_fallback({}, said.append) == []
    assert said == []


def test_a_python_closed_to_others_runs_shards_as_the_agent_and_says_why(
    root: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shard_user, "interpreter_blocked", lambda: "/root is closed to other users")
    said: list[str] = []

    assert shard_user.shard_user_fallback({}, said.append) == ["--shard-user", "agent"]
    (warning,) = said
    assert "shards run as root" in warning and "/root is closed to other users" in warning


def test_the_operators_choice_wins(root: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shard_user, "interpreter_blocked", lambda: "/root is closed to other users")
    said: list[str] = []

    assert shard_user.shard_user_fallback({"SHARDYARD_SHARD_USER": "job"}, said.append) == []
    assert said == []


def test_an_agent_that_is_not_root_runs_shards_as_itself_anyway(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)

    assert shard_user.shard_user_fallback({}, print) == []


def test_the_closed_directory_on_the_way_to_python_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    (shared / "bin").mkdir(parents=True)
    (shared / "bin" / "python").write_text("")
    for directory in (tmp_path, shared, shared / "bin"):
        directory.chmod(0o755)
    (shared / "bin" / "python").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(shared / "bin" / "python"))
    opened = shard_user.interpreter_blocked()
    shared.chmod(0o700)

    closed = shard_user.interpreter_blocked()

    assert opened is None or str(tmp_path) not in opened  # what is above the temporary folder is the machine's
    assert closed is not None and closed.startswith(f"{shared} is closed to other users")
