from __future__ import annotations

from pathlib import Path

import pytest

from shardyard.errors import ConfigError
from shardyard.node_agent.mounts import LocalDisk, parse_mounts, parse_shared_mounts, resolve

MOUNTS = {"/data": "/srv/data", "/data/models": "/fast/models", "/scratch": "/tmp/scratch"}


@pytest.mark.parametrize(
    ("job_path", "local"),
    [
        pytest.param("/data/datasets/wikitext", "/srv/data/datasets/wikitext", id="mounted"),
        pytest.param("/data/models/gpt2", "/fast/models/gpt2", id="longest-prefix-wins"),
        pytest.param("/data/modelsx/gpt2", "/srv/data/modelsx/gpt2", id="prefix-is-a-path-component"),
        pytest.param("/data", "/srv/data", id="the-mount-itself"),
        pytest.param("/data/", "/srv/data", id="trailing-slash"),
        pytest.param("/database/x", "/database/x", id="database-is-not-data"),
        pytest.param("/opt/models/gpt2", "/opt/models/gpt2", id="unmapped-unchanged"),
        pytest.param("relative/path", "relative/path", id="relative-unchanged"),
    ],
)
def test_resolve(job_path: str, local: str) -> None:
    assert resolve(job_path, MOUNTS) == Path(local)


def test_resolve_without_mounts_is_identity() -> None:
    assert resolve("/data/models/gpt2", {}) == Path("/data/models/gpt2")


def test_parse_mounts(tmp_path: Path) -> None:
    models = tmp_path / "models"

    mounts = parse_mounts([f"/data={tmp_path}", f"/data/models/={models}"])

    assert mounts == {"/data": str(tmp_path.resolve()), "/data/models": str(models.resolve())}


def test_parse_mounts_resolves_relative_local_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    assert parse_mounts(["/data=./data"]) == {"/data": str(tmp_path.resolve() / "data")}


@pytest.mark.parametrize(
    "item",
    [
        pytest.param("/data", id="no-equals"),
        pytest.param("data=/srv/data", id="relative-prefix"),
        pytest.param("/data=", id="no-local-dir"),
        pytest.param("=/srv/data", id="no-prefix"),
        pytest.param("", id="empty"),
    ],
)
def test_parse_mounts_errors(item: str) -> None:
    with pytest.raises(ConfigError, match="JOB_PREFIX=LOCAL_DIR"):
        parse_mounts([item])


def test_parse_shared_mounts() -> None:
    assert parse_shared_mounts(["/data/shared/", "/nfs", "/nfs/"]) == ("/data/shared", "/nfs")


@pytest.mark.parametrize("item", [pytest.param("data/shared", id="relative"), pytest.param("", id="empty")])
def test_parse_shared_mounts_errors(item: str) -> None:
    with pytest.raises(ConfigError, match="absolute job path prefix"):
        parse_shared_mounts([item])


def test_local_disk(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")

    assert [LocalDisk().is_dir(tmp_path / name) for name in ("dir", "file", "absent")] == [True, False, False]
