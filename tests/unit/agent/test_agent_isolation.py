"""An agent whose shards run as users of their jobs' own: what it gives the launcher, the directories it makes the
job's alone before a launch, the inputs it refuses to launch without, and what it removes at the job's end. The
fake launcher starts nothing; the files are real (changing their owner takes root: without it these skip)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from shardyard.events import FailureCause, JobSucceeded, ShardFailed, ShardStarted
from shardyard.events.job import Entrypoint
from shardyard.node_agent.shard_users import ShardUsers
from tests.support.cluster import reachable_by_shards
from tests.unit.agent.test_agent_handlers import Agent, spare
from tests.unit.builders import T0, assignment, workload

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")

USERS = ShardUsers(base=300_000, count=1000)
JOB_USER = USERS.of("job-1")
assert JOB_USER is not None


def isolated(tmp_path: Path) -> Agent:
    reachable_by_shards(tmp_path)
    agent = Agent(tmp_path, shard_users=USERS, peer_state_dir=tmp_path / "peers", lease_file=tmp_path / "n.lease")
    agent.inputs()
    return agent


def mode_and_owner(path: Path) -> tuple[int, int, int]:
    found = os.stat(path)
    return stat.S_IMODE(found.st_mode), found.st_uid, found.st_gid


async def test_a_shard_starts_as_its_jobs_user_with_its_directories_its_own(tmp_path: Path) -> None:
    agent = isolated(tmp_path)

    await agent.handlers.on_assignment(assignment())
    await agent.until(lambda: agent.bus.of(ShardStarted))

    (spec,) = agent.launcher.specs
    me, mine = os.geteuid(), (0o700, JOB_USER.uid, JOB_USER.gid)
    assert spec.user == JOB_USER
    assert (spec.env["HOME"], spec.env["TMPDIR"]) == (str(tmp_path / "scratch/job-1"),) * 2
    assert mode_and_owner(agent.root / "checkpoints/job-1") == mine
    assert mode_and_owner(tmp_path / "peers/job-1") == mine
    assert mode_and_owner(tmp_path / "scratch/job-1") == mine
    assert mode_and_owner(tmp_path / "logs/job-1") == (0o710, me, JOB_USER.gid)
    # The parent every output shares: the runner's final save swaps the output for a sibling it creates there.
    assert mode_and_owner(agent.root / "checkpoints")[:2] == (0o1777, me)


async def test_an_entrypoint_jobs_output_parent_is_left_as_it_was(tmp_path: Path) -> None:
    agent = isolated(tmp_path)

    await agent.handlers.on_assignment(assignment(workload=workload(entrypoint=Entrypoint(command=["train"]))))
    await agent.until(lambda: agent.bus.of(ShardStarted))

    assert mode_and_owner(agent.root / "checkpoints/job-1")[:2] == (0o700, JOB_USER.uid)
    assert mode_and_owner(agent.root / "checkpoints")[:2] == (0o755, os.geteuid())


async def test_an_input_out_of_the_users_reach_fails_the_launch_with_the_directory_in_the_way(tmp_path: Path) -> None:
    agent = isolated(tmp_path)
    (agent.root / "datasets").chmod(0o700)

    await agent.handlers.on_assignment(assignment())
    (failed,) = await agent.until(lambda: agent.bus.of(ShardFailed))

    assert failed.cause is FailureCause.LAUNCH_ERROR
    assert f"out of reach of the shard's user (uid {JOB_USER.uid})" in failed.message
    assert f"{agent.root / 'datasets'} is drwx------" in failed.message
    assert agent.launcher.specs == []


async def test_an_output_another_jobs_user_owns_is_not_handed_over(tmp_path: Path) -> None:
    agent = isolated(tmp_path)
    output = agent.root / "checkpoints/job-1"
    output.mkdir(parents=True)
    os.chown(output, 301_999, 301_999)

    await agent.handlers.on_assignment(assignment())
    (failed,) = await agent.until(lambda: agent.bus.of(ShardFailed))

    assert failed.cause is FailureCause.LAUNCH_ERROR and "belongs to uid 301999" in failed.message
    assert mode_and_owner(output)[1] == 301_999


async def test_a_standby_runs_as_its_jobs_user_and_gets_its_shard_log_made_for_it(tmp_path: Path) -> None:
    agent = isolated(tmp_path)

    await agent.handlers.on_assignment(spare())
    (warm,) = await agent.until(lambda: agent.launcher.standbys)
    assert warm.spec.user == JOB_USER and warm.spec.env["HOME"] == str(tmp_path / "scratch/job-1")
    await agent.handlers.on_assignment(assignment(shard_index=1, attempt=2, gpu_indices=(1,)))

    (order,) = warm.orders
    assert mode_and_owner(Path(order.log)) == (0o600, JOB_USER.uid, JOB_USER.gid)


async def test_the_jobs_end_removes_its_private_home_and_peer_state(tmp_path: Path) -> None:
    agent = isolated(tmp_path)
    await agent.handlers.on_assignment(assignment())
    await agent.until(lambda: agent.bus.of(ShardStarted))

    await agent.handlers.on_lifecycle(
        JobSucceeded(occurred_at=T0, job_id="job-1", attempt=1, final_loss=None, checkpoint_dir=None)
    )

    assert not (tmp_path / "scratch/job-1").exists() and not (tmp_path / "peers/job-1").exists()
    assert (agent.root / "checkpoints/job-1").is_dir()  # the job's output is its result: it stays
