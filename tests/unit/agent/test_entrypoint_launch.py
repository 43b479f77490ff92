"""What the agent starts for a job's own command: the supervisor and the argv verbatim, in the job's working
directory, with the torchrun environment the runtime owns; a job without entrypoint starts exactly what it did."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardyard import secret_env
from shardyard.events import ShardAssignment, ShardCompleted, ShardStarted
from shardyard.events.job import Entrypoint
from shardyard.node_agent.book import AgentBook
from shardyard.node_agent.environment import RunnerOptions, ShardPaths, opened_env, shard_argv, shard_env
from shardyard.training.preemption import RESUME_DIR_ENV
from tests.unit.agent.test_agent_handlers import Agent
from tests.unit.builders import assignment, workload

MOUNTS = {"/data": "/srv/data"}
RUNTIME = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _assignment(entrypoint: Entrypoint | None = None, **overrides: object) -> ShardAssignment:
    return assignment(shard_index=1, gpu_indices=(1,), workload=workload(entrypoint=entrypoint, **overrides))


def _paths(entrypoint: Entrypoint | None = None, **overrides: object) -> ShardPaths:
    return AgentBook("node-a").paths(_assignment(entrypoint, **overrides), MOUNTS)


def _env(entrypoint: Entrypoint | None, base: dict[str, str] | None = None, **overrides: object) -> dict[str, str]:
    job = _assignment(entrypoint, **overrides)
    paths = AgentBook("node-a").paths(job, MOUNTS)
    options = RunnerOptions(lease_file="/run/node-a.lease")
    return shard_env(job, paths, base_env=base or {"PATH": "/usr/bin"}, options=options, local_world_size=4)


def test_without_entrypoint_the_built_in_runner_starts() -> None:
    assert shard_argv(_assignment(), _paths(), python="/venv/bin/python") == (
        "/venv/bin/python",
        "-m",
        "shardyard.training.shard",
    )


def test_without_entrypoint_the_environment_is_the_runners() -> None:
    env = _env(None)

    assert "LOCAL_WORLD_SIZE" not in env and "SHARDYARD_CHECKPOINT_DIR" not in env and "PYTHONUNBUFFERED" not in env
    assert (env["RANK"], env["LOCAL_RANK"], env["OMP_NUM_THREADS"]) == ("1", "1", "1")


@pytest.mark.parametrize(
    ("entrypoint", "argv"),
    [
        pytest.param(
            Entrypoint(command=["python", "train.py", "--lr", "0.1"]),
            ("py", "-m", "shardyard.training.entry", "--", "python", "train.py", "--lr", "0.1"),
            id="agent-working-dir",
        ),
        pytest.param(
            Entrypoint(command=["./run.sh", "a b", "$HOME;"], working_dir="/data/code"),
            ("py", "-m", "shardyard.training.entry", "--cwd", "/srv/data/code", "--", "./run.sh", "a b", "$HOME;"),
            id="mounted-working-dir-and-verbatim-args",
        ),
        pytest.param(
            Entrypoint(command=["--", "-x"], working_dir="jobs/a"),
            ("py", "-m", "shardyard.training.entry", "--cwd", "jobs/a", "--", "--", "-x"),
            id="relative-working-dir-and-dashes",
        ),
    ],
)
def test_an_entrypoint_runs_under_the_supervisor(entrypoint: Entrypoint, argv: tuple[str, ...]) -> None:
    assert shard_argv(_assignment(entrypoint), _paths(entrypoint), python="py") == argv


def test_the_entrypoint_environment() -> None:
    entrypoint = Entrypoint(command=["python", "train.py"], env={"HF_HOME": "/cache", "OMP_NUM_THREADS": "4"})

    env = _env(entrypoint, resume_from="/data/checkpoints/job-1/checkpoint")

    assert {name: env[name] for name in RUNTIME} == {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }
    assert env["SHARDYARD_CHECKPOINT_DIR"] == "/srv/data/checkpoints/job-1/checkpoint"
    assert env["SHARDYARD_OUTPUT_DIR"] == "/srv/data/checkpoints/job-1"
    assert env[RESUME_DIR_ENV] == "/srv/data/checkpoints/job-1/checkpoint"
    assert (env["SHARDYARD_SYNC_INTERVAL"], env["SHARDYARD_JOB_ID"], env["SHARDYARD_ATTEMPT"]) == ("100", "job-1", "1")
    assert env["SHARDYARD_AGENT_LEASE_FILE"] == "/run/node-a.lease"
    assert (env["HF_HOME"], env["OMP_NUM_THREADS"], env["PYTHONUNBUFFERED"], env["PATH"]) == (
        "/cache",
        "4",
        "1",
        "/usr/bin",
    )


def test_the_runtime_wins_over_the_agents_environment() -> None:
    entrypoint = Entrypoint(command=["train"])

    env = _env(entrypoint, base={"RANK": "7", "MASTER_PORT": "1", "PYTHONUNBUFFERED": "", "LANG": "C"})

    assert (env["RANK"], env["MASTER_PORT"], env["PYTHONUNBUFFERED"], env["LANG"]) == ("1", "29500", "1", "C")


def test_a_private_home_and_the_nodes_interface_under_what_the_agent_and_the_job_say() -> None:
    job = _assignment(Entrypoint(command=["train"], env={"TMPDIR": "/fast"}))
    paths = AgentBook("node-a").paths(job, MOUNTS)
    base = {"HOME": "/root", "NCCL_SOCKET_IFNAME": "=ib0"}

    env = shard_env(job, paths, base_env=base, options=RunnerOptions(socket_ifname="eth0"), home=Path("/s/job-1"))

    assert (env["HOME"], env["TMPDIR"]) == ("/s/job-1", "/fast")  # the job's own TMPDIR wins
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("eth0", "=ib0")  # so does the operator's
    runner = shard_env(_assignment(), _paths(), base_env=base, options=RunnerOptions(), home=Path("/s/job-1"))
    assert (runner["HOME"], runner["TMPDIR"]) == ("/s/job-1", "/s/job-1") and "GLOO_SOCKET_IFNAME" not in runner


def test_a_shard_under_a_user_of_its_own_goes_by_that_users_name_not_the_agents() -> None:
    base = {"USER": "root", "LOGNAME": "root", "HOME": "/root"}

    for env in (
        shard_env(_assignment(), _paths(), base_env=base, home=Path("/s/job-1"), user_name="shard-262959"),
        shard_env(_assignment(Entrypoint(command=["train"])), _paths(), base_env=base, user_name="shard-262959"),
    ):
        assert (env["USER"], env["LOGNAME"]) == ("shard-262959", "shard-262959")
    as_agent = shard_env(_assignment(), _paths(), base_env=base)
    assert (as_agent["USER"], as_agent["LOGNAME"]) == ("root", "root")


def test_a_gang_of_a_jobs_own_script_rendezvous_at_the_runtimes_store() -> None:
    entrypoint = Entrypoint(command=["train"], env={"TORCHELASTIC_USE_AGENT_STORE": "False"})
    third = assignment(attempt=3, workload=workload(entrypoint=entrypoint))
    single = assignment(world_size=1, workload=workload(entrypoint=Entrypoint(command=["train"])))

    gang = shard_env(third, _paths(entrypoint), base_env={})

    assert (gang["TORCHELASTIC_USE_AGENT_STORE"], gang["TORCHELASTIC_RESTART_COUNT"]) == ("True", "2")
    assert "TORCHELASTIC_USE_AGENT_STORE" not in shard_env(single, _paths(), base_env={})
    assert "TORCHELASTIC_USE_AGENT_STORE" not in _env(None)  # the built-in runner binds its own store


def test_the_built_in_runner_never_inherits_an_agent_store_from_the_agent() -> None:
    inherited = {"PATH": "/usr/bin", "TORCHELASTIC_USE_AGENT_STORE": "True"}  # an agent started under torchrun

    env = _env(None, inherited)

    assert "TORCHELASTIC_USE_AGENT_STORE" not in env and env["PATH"] == "/usr/bin"


def test_local_world_size_covers_the_local_rank() -> None:
    job = assignment(gpu_indices=(5,), workload=workload(entrypoint=Entrypoint(command=["train"])))
    paths = AgentBook("node-a").paths(job, MOUNTS)

    env = shard_env(job, paths, base_env={}, local_world_size=2)

    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("5", "6")


async def test_the_agent_launches_the_entrypoint_with_the_shard_log(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    agent.inputs()
    (agent.root / "code").mkdir()
    entrypoint = Entrypoint(command=["python", "train.py"], env={"A": "1"}, working_dir="/data/code")

    await agent.handlers.on_assignment(assignment(workload=workload(entrypoint=entrypoint)))
    await agent.until(lambda: agent.bus.of(ShardStarted))

    (spec,) = agent.launcher.specs
    assert spec.argv == (
        "python",
        "-m",
        "shardyard.training.entry",
        "--cwd",
        str(agent.root / "code"),
        "--",
        *entrypoint.command,
    )
    assert (spec.env["A"], spec.env["LOCAL_WORLD_SIZE"], spec.env["RANK"]) == ("1", "2", "0")
    assert spec.log_path == tmp_path / "logs" / "job-1" / "shard-0-attempt-1.log"
    agent.launcher.processes[0].end(0)
    await agent.until(lambda: agent.bus.of(ShardCompleted))


def test_the_agent_opens_values_encrypted_to_it_for_the_shard_and_refuses_others() -> None:
    key = secret_env.agents_key(b"c" * 32)
    value = secret_env.encrypt(key, "job-1", "TOKEN", "s3cret", sealer=secret_env.AGENTS)
    job = _assignment(Entrypoint(command=["train"], env={"TOKEN": value, "PLAIN": "p"}))

    opened = opened_env(job, key)

    assert opened.workload.entrypoint is not None
    assert opened.workload.entrypoint.env == {"TOKEN": "s3cret", "PLAIN": "p"}
    assert shard_env(opened, _paths(Entrypoint(command=["train"])), base_env={})["TOKEN"] == "s3cret"
    with pytest.raises(secret_env.SecretEnvError):
        opened_env(job, secret_env.agents_key(b"d" * 32))


@pytest.mark.parametrize("entrypoint", [None, Entrypoint(command=["train"])], ids=["built-in-runner", "own-script"])
@pytest.mark.parametrize(("notice_s", "told"), [(12.5, "12.5"), (None, "30.0")], ids=["scheduler-says", "default"])
def test_every_shard_is_told_its_notice_signal_and_seconds(
    entrypoint: Entrypoint | None, notice_s: float | None, told: str
) -> None:
    job = _assignment(entrypoint).model_copy(update={"notice_s": notice_s})

    env = shard_env(job, _paths(entrypoint), base_env={"SHARDYARD_NOTICE_S": "1"})

    assert (env["SHARDYARD_NOTICE_SIGNAL"], env["SHARDYARD_NOTICE_S"]) == ("SIGUSR1", told)
