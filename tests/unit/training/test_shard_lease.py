"""The shard's lease on its agent: the watchdog fences the shard once the lease file ages, never before."""

import os
import threading
import time
from pathlib import Path

import pytest

from shardyard.liveness import MAX_MARGIN_S
from shardyard.node_agent.environment import RunnerOptions
from shardyard.training import exitcodes
from shardyard.training.exitcodes import ExitCause, classify_exit
from shardyard.training.lease import LEASE_FILE_ENV, LEASE_S_ENV, expired, renew, silence, start_watchdog


def watched(path: Path, lease_s: float) -> tuple[threading.Event, list[int]]:
    fired, codes = threading.Event(), []

    def exit_now(code: int) -> None:
        codes.append(code)
        fired.set()

    start_watchdog({LEASE_FILE_ENV: str(path), LEASE_S_ENV: str(lease_s)}, exit_now=exit_now)
    return fired, codes


def test_an_aged_lease_fences_the_shard(tmp_path: Path) -> None:
    lease = tmp_path / "node.lease"
    renew(str(lease))
    os.utime(lease, (time.time() - 10, time.time() - 10))

    fired, codes = watched(lease, 2.5)

    assert fired.wait(timeout=5)
    assert codes == [exitcodes.FENCED]


def test_a_missing_lease_file_fences_the_shard(tmp_path: Path) -> None:
    fired, codes = watched(tmp_path / "never-written.lease", 2.5)

    assert fired.wait(timeout=5) and codes == [exitcodes.FENCED]


def test_a_renewed_lease_keeps_the_shard_running(tmp_path: Path) -> None:
    lease = tmp_path / "node.lease"
    renew(str(lease))
    fired, _ = watched(lease, 1.0)
    deadline = time.monotonic() + 2.5  # well past the lease, renewed all along
    while time.monotonic() < deadline:
        renew(str(lease))
        assert not fired.wait(timeout=0.2)
    assert silence(str(lease), time.time()) < 1.0


def test_a_lease_renewed_with_a_margin_lasts_that_much_longer(tmp_path: Path) -> None:
    lease = str(tmp_path / "node.lease")
    renew(lease, 2.0)
    now = os.stat(lease).st_mtime
    assert expired(lease, now + 4.4, 2.5) is None  # a loaded host's agent: 2.5 s + its 2 s margin
    assert expired(lease, now + 4.6, 2.5) == pytest.approx(4.6)
    renew(lease)  # the margin is that of the last renewal
    now = os.stat(lease).st_mtime
    assert expired(lease, now + 2.6, 2.5) is not None


def test_a_margin_is_capped_whatever_the_file_says(tmp_path: Path) -> None:
    lease = tmp_path / "node.lease"
    renew(str(lease))
    lease.write_text("1e9")
    now = os.stat(lease).st_mtime
    assert expired(str(lease), now + 2.5 + MAX_MARGIN_S, 2.5) is not None


def test_the_watchdog_keeps_a_shard_through_its_agents_margin(tmp_path: Path) -> None:
    lease = tmp_path / "node.lease"
    renew(str(lease), 1.0)
    fired, codes = watched(lease, 0.5)
    assert not fired.wait(timeout=1.0)  # past the 0.5 s lease, within its 1 s margin
    assert fired.wait(timeout=3) and codes == [exitcodes.FENCED]


def test_no_lease_in_the_environment_means_no_watchdog() -> None:
    assert start_watchdog({}) is None


def test_the_agent_passes_its_lease_to_every_shard() -> None:
    env = RunnerOptions(lease_file="/run/n1.lease", shard_lease_s=2.5).env()
    assert env[LEASE_FILE_ENV] == "/run/n1.lease" and float(env[LEASE_S_ENV]) == 2.5
    assert LEASE_FILE_ENV not in RunnerOptions().env()


def test_a_fenced_exit_is_classified() -> None:
    assert classify_exit(exitcodes.FENCED) is ExitCause.FENCED
