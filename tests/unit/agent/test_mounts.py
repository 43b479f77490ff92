from __future__ import annotations

from pathlib import Path

import pytest

from shardyard.errors import ConfigError, JobPathError
from shardyard.node_agent.mounts import LocalDisk, confine, parse_mounts, parse_shared_mounts, resolve

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


@pytest.mark.parametrize(
    ("job_path", "local"),
    [
        pytest.param("/data/datasets/wikitext", "/srv/data/datasets/wikitext", id="mounted"),
        pytest.param("/data/models/gpt2", "/fast/models/gpt2", id="longest-prefix-wins"),
        pytest.param("/data", "/srv/data", id="the-mount-itself"),
        pytest.param("/data/", "/srv/data", id="one-trailing-slash"),
        pytest.param("/data/a..b/.x", "/srv/data/a..b/.x", id="dots-inside-a-name"),
        pytest.param("/data/modelsx/gpt2", "/srv/data/modelsx/gpt2", id="prefix-is-a-path-component"),
    ],
)
def test_confine_maps_a_served_path(job_path: str, local: str) -> None:
    assert confine(job_path, MOUNTS) == Path(local)


@pytest.mark.parametrize(
    ("job_path", "why"),
    [
        pytest.param("data/x", "not absolute", id="relative"),
        pytest.param("", "not absolute", id="empty"),
        pytest.param("/data/../etc/passwd", "not normalised", id="dot-dot"),
        pytest.param("/data/x/..", "not normalised", id="trailing-dot-dot"),
        pytest.param("/data/./x", "not normalised", id="dot"),
        pytest.param("/data//x", "not normalised", id="double-slash"),
        pytest.param("//data/x", "not normalised", id="leading-double-slash"),
        pytest.param("/data/x//", "not normalised", id="two-trailing-slashes"),
        pytest.param("/data/x\x00y", "NUL", id="nul"),
        pytest.param("/database/x", "not under a mount", id="database-is-not-data"),
        pytest.param("/etc/passwd", "not under a mount", id="unmapped"),
        pytest.param("/", "not under a mount", id="root"),
    ],
)
def test_confine_refuses_a_path_the_node_does_not_serve(job_path: str, why: str) -> None:
    with pytest.raises(JobPathError, match=why):
        confine(job_path, MOUNTS)


def test_confine_without_mounts_serves_the_nodes_own_paths_but_keeps_the_structural_rules() -> None:
    assert confine("/opt/models/gpt2", {}) == Path("/opt/models/gpt2")
    with pytest.raises(JobPathError, match="not normalised"):
        confine("/opt/../etc", {})


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

    assert [LocalDisk().is_dir(tmp_path / name) for name in ("dir", "file", "absent", "file/below")] == [
        True,
        False,
        False,
        False,
    ]


def test_local_disk_raises_when_it_cannot_tell(tmp_path: Path) -> None:
    """Unlike ``Path.is_dir`` (which answers False for a link loop and raises for a long name), every failure to look
    raises, so the caller can say why the path counts as absent."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(OSError, match="too long"):
        LocalDisk().is_dir(tmp_path / ("x" * 5000))
    with pytest.raises(OSError, match="symbolic links"):
        LocalDisk().is_dir(tmp_path / "loop")
    with pytest.raises(ValueError, match="null"):
        LocalDisk().is_dir(tmp_path / "a\x00b")
