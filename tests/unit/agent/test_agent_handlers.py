"""The agent's handlers with in-memory seams: a recording publisher, fake shard processes and a fake disk."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from shardyard.events import (
    Heartbeat,
    JobAccepted,
    JobSucceeded,
    NodeLease,
    RevocationReason,
    ShardAssignment,
    ShardCompleted,
    ShardFailed,
    ShardPreempted,
    ShardProgress,
    ShardRevocation,
    ShardStarted,
    ShardStopRequest,
    StopReason,
)
from shardyard.events.job import Entrypoint
from shardyard.node_agent.artifacts import ArtifactWatch
from shardyard.node_agent.book import AgentBook
from shardyard.node_agent.environment import RunnerOptions
from shardyard.node_agent.handlers import AgentHandlers
from shardyard.node_agent.identity import NodeIdentity
from shardyard.node_agent.inventory import SimulatedGpus
from shardyard.node_agent.launcher import LaunchSpec
from shardyard.node_agent.load import LoadSource
from shardyard.node_agent.shard_users import ShardUsers
from shardyard.node_agent.warm import Mode
from shardyard.training import exitcodes, standby
from shardyard.training.config import PEER_STATE_DIR_ENV
from shardyard.training.preemption import STOP_SIGNAL
from tests.support import wait
from tests.support.clock import FakeClock
from tests.support.events import Recorder
from tests.unit.builders import T0, assignment, job_spec, workload

MODEL = "/data/models/gpt2"
DATA = "/data/datasets/wikitext"


class FakeDisk:
    def __init__(self) -> None:
        self.dirs: set[Path] = set()

    def is_dir(self, path: Path) -> bool:
        return path in self.dirs


class FakeProcess:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.lines: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.signals: list[int] = []

    async def progress(self) -> AsyncIterator[bytes]:
        while (line := await self.lines.get()) is not None:
            yield line

    async def wait(self) -> int:
        return await self.exit

    def signal(self, sig: int) -> None:
        self.signals.append(sig)

    def terminate(self) -> None:
        self.end(-15)

    def kill(self) -> None:
        self.end(-9)

    def report(self, **line: object) -> None:
        self.lines.put_nowait(json.dumps(line).encode() + b"\n")

    def end(self, code: int) -> None:
        if not self.exit.done():
            self.lines.put_nowait(None)
            self.exit.set_result(code)


class FakeStandby:
    def __init__(self, pid: int, spec: LaunchSpec) -> None:
        self.pid = pid
        self.spec = spec
        self.orders: list[standby.Order] = []
        self.discarded = False
        self.dead = False
        self.process = FakeProcess(pid)

    def alive(self) -> bool:
        return not (self.dead or self.discarded)

    async def go(self, order: bytes) -> FakeProcess:
        if not self.alive():
            raise OSError(f"standby {self.pid} is gone")
        self.orders.append(standby.Order.decode(order))
        return self.process

    def discard(self) -> None:
        self.discarded = True


class FakeLauncher:
    def __init__(self) -> None:
        self.specs: list[LaunchSpec] = []
        self.processes: list[FakeProcess] = []
        self.standbys: list[FakeStandby] = []

    async def launch(self, spec: LaunchSpec, *, progress_env: str) -> FakeProcess:
        self.specs.append(spec)
        self.processes.append(FakeProcess(1000 + len(self.processes)))
        return self.processes[-1]

    async def standby(self, spec: LaunchSpec, *, progress_env: str) -> FakeStandby:
        self.standbys.append(FakeStandby(2000 + len(self.standbys), spec))
        return self.standbys[-1]


class Agent:
    def __init__(
        self,
        tmp_path: Path,
        *,
        load_source: LoadSource = "host",
        cpu_cores: float = 16.0,
        shared: tuple[str, ...] = (),
        topology: Mapping[str, str] | None = None,
        host_load: Callable[[], float] = lambda: 0.25,
        standbys: Mode = "spares",
        peer_state_dir: Path | None = None,
        shard_users: ShardUsers | None = None,
        lease_file: Path | None = None,
    ) -> None:
        self.root = tmp_path / "data"
        self.bus = Recorder()
        self.disk = FakeDisk()
        self.launcher = FakeLauncher()
        identity = NodeIdentity(
            node_id="node-a",
            instance="node-a-1",
            address="127.0.0.1",
            rendezvous_ports=(29500, 8),
            cpu_cores=cpu_cores,
            memory_bytes=1 << 30,
            mounts={"/data": str(self.root)},
            log_dir=tmp_path / "logs",
            python="python",
            base_env={},
            load_source=load_source,
            topology=dict(topology or {}),
            standbys=standbys,
            standby_ttl_s=60.0,
            runner=RunnerOptions(
                peer_state_dir=None if peer_state_dir is None else str(peer_state_dir),
                lease_file=None if lease_file is None else str(lease_file),
            ),
            shard_users=shard_users or ShardUsers(),
            scratch_dir=tmp_path / "scratch",
        )
        self.clock = FakeClock(T0)
        self.handlers = AgentHandlers(
            identity,
            AgentBook("node-a"),
            self.bus,
            self.clock,
            SimulatedGpus(["A100:2"]),
            self.launcher,
            watch=ArtifactWatch(shared_prefixes=shared),
            disk=self.disk,
            host_load=host_load,
        )

    def inputs(self) -> None:
        """Real model and dataset directories, for shards to launch (the launch check looks at the real disk)."""
        for name in ("models/gpt2", "datasets/wikitext"):
            (self.root / name).mkdir(parents=True, exist_ok=True)

    def create(self, job_path: str) -> None:
        self.disk.dirs.add(self.root / job_path.removeprefix("/data/"))

    def remove(self, job_path: str) -> None:
        self.disk.dirs.discard(self.root / job_path.removeprefix("/data/"))

    def beats(self) -> list[Heartbeat]:
        return self.bus.of(Heartbeat)

    async def until(self, condition: Callable[[], Any], timeout_s: float = 5.0) -> Any:
        return await wait.eventually(condition, "the agent's condition", timeout_s, every_s=0.01)


def accepted(job_id: str = "job-1", model: str = MODEL, dataset: str = DATA) -> JobAccepted:
    spec = job_spec(job_id=job_id, model_path=model, dataset_path=dataset)
    return JobAccepted(occurred_at=T0, job_id=job_id, spec=spec, source_offset=f"subs/0/{job_id}")


async def test_a_new_job_whose_artifacts_are_here_is_reported_at_once(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    agent.create(MODEL)

    await agent.handlers.on_lifecycle(accepted())

    (beat,) = agent.beats()
    assert beat.artifacts == {MODEL: "local"}


async def test_a_new_job_whose_artifacts_are_absent_is_reported_absent_once(tmp_path: Path) -> None:
    """The scheduler tells a path looked for and not found from one not looked at yet by this report: a job waits
    for its data only once it is reported absent. Polls that find it still absent send nothing more."""
    agent = Agent(tmp_path)

    await agent.handlers.on_lifecycle(accepted())
    await agent.handlers.poll_artifacts()

    (beat,) = agent.beats()
    assert beat.artifacts == {} and beat.artifacts_absent == tuple(sorted({MODEL, DATA}))


async def test_an_artifact_that_appears_is_reported_by_the_next_poll(tmp_path: Path) -> None:
    agent = Agent(tmp_path, shared=("/data/models",))
    agent.create(MODEL)
    await agent.handlers.on_lifecycle(accepted())
    await agent.handlers.poll_artifacts()  # nothing new
    assert len(agent.beats()) == 1

    agent.create(DATA)
    await agent.handlers.poll_artifacts()

    assert [b.artifacts for b in agent.beats()] == [{MODEL: "shared"}, {MODEL: "shared", DATA: "local"}]


async def test_an_artifact_that_went_away_is_no_longer_reported(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    agent.create(MODEL)
    agent.create(DATA)
    await agent.handlers.on_lifecycle(accepted())

    agent.remove(DATA)
    await agent.handlers.heartbeat()

    assert [b.artifacts for b in agent.beats()] == [{MODEL: "local", DATA: "local"}, {MODEL: "local"}]


async def test_an_ended_job_is_no_longer_watched(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    agent.create(MODEL)
    await agent.handlers.on_lifecycle(accepted())

    await agent.handlers.on_lifecycle(
        JobSucceeded(occurred_at=T0, job_id="job-1", attempt=1, final_loss=None, checkpoint_dir=None)
    )
    await agent.handlers.heartbeat()

    assert agent.beats()[-1].artifacts == {}


async def test_heartbeat_carries_topology_and_sequence(tmp_path: Path) -> None:
    agent = Agent(tmp_path, topology={"zone": "eu-1"})

    await asyncio.gather(*(agent.handlers.heartbeat() for _ in range(3)))

    sent = agent.bus.of(Heartbeat | NodeLease)
    assert [b.seq for b in sent] == [1, 2, 3]
    # The inventory goes out once; leases renew the node's liveness until it changes.
    assert [type(b) for b in sent] == [Heartbeat, NodeLease, NodeLease]
    assert agent.beats()[0].topology == {"zone": "eu-1"}


@pytest.mark.parametrize(
    ("source", "expected"),
    [pytest.param("host", 0.9, id="host-load-average"), pytest.param("shards", 1.6 / 8, id="own-shards")],
)
async def test_cpu_load_source(tmp_path: Path, source: LoadSource, expected: float) -> None:
    agent = Agent(tmp_path, load_source=source, cpu_cores=8.0, host_load=lambda: 0.9)
    agent.inputs()
    for index in (0, 1):
        await agent.handlers.on_assignment(assignment(shard_index=index))
        agent.launcher.processes[index].report(kind="progress", step=1, cpu_percent=80.0)
    await agent.until(lambda: len(agent.handlers.book.utilization) == 2)

    await agent.handlers.heartbeat()

    assert agent.beats()[-1].cpu_load == pytest.approx(expected)
    for process in agent.launcher.processes:
        process.end(0)
    await agent.until(lambda: not agent.handlers.tasks)


async def test_a_stop_request_signals_the_shard_and_its_preemption_is_reported(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    agent.inputs()
    shard = assignment(world_size=1, workload=workload(output_path="/data/checkpoints/job-1"))
    await agent.handlers.on_assignment(shard)
    (process,) = agent.launcher.processes
    request = ShardStopRequest(
        occurred_at=T0, job_id="job-1", shard_index=0, node_id="node-a", attempt=1, term=1, reason=StopReason.PREEMPTED
    )

    await agent.handlers.on_assignment(request)
    await agent.handlers.on_assignment(request)  # redelivered: nothing more

    assert process.signals == [STOP_SIGNAL]
    process.report(kind="progress", step=100, cpu_percent=90.0)
    process.report(kind="preempted", step=100, checkpoint_dir=str(tmp_path / "data/checkpoints/job-1/checkpoint"))
    process.end(exitcodes.PREEMPTED)
    (preempted,) = await agent.until(lambda: agent.bus.of(ShardPreempted))
    assert (preempted.step, preempted.checkpoint_dir) == (100, "/data/checkpoints/job-1/checkpoint")
    assert len(agent.bus.of(ShardStarted)) == 1


async def test_a_resumed_shard_gets_its_checkpoint_through_the_mounts(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    agent.inputs()
    (agent.root / "checkpoints/job-1/checkpoint").mkdir(parents=True)
    shard = assignment(workload=workload(resume_from="/data/checkpoints/job-1/checkpoint"))

    await agent.handlers.on_assignment(shard)

    (spec,) = agent.launcher.specs
    assert spec.env["SHARDYARD_RESUME_DIR"] == str(agent.root / "checkpoints/job-1/checkpoint")
    agent.launcher.processes[0].end(0)
    await agent.until(lambda: not agent.handlers.tasks)


# -- warm standbys -------------------------------------------------------------------------------------------------


def spare(job_id: str = "job-1", shard_index: int = 1, **overrides: Any) -> ShardAssignment:
    return assignment(job_id=job_id, shard_index=shard_index, spare=True, **overrides)


async def test_a_held_spare_gets_a_standby_that_its_promotion_takes(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    agent.inputs()

    await agent.handlers.on_assignment(spare())
    (warm,) = await agent.until(lambda: agent.launcher.standbys)
    assert warm.spec.argv[1:] == ("-m", standby.MODULE)
    assert warm.spec.env["OMP_NUM_THREADS"] == "1"

    await agent.handlers.on_assignment(assignment(shard_index=1, attempt=2, gpu_indices=(1,)))

    assert agent.launcher.specs == []  # nothing started cold
    (order,) = warm.orders
    assert (order.env["RANK"], order.env["SHARDYARD_ATTEMPT"], order.env["LOCAL_RANK"]) == ("1", "2", "1")
    assert order.log == str(tmp_path / "logs/job-1/shard-1-attempt-2.log")
    (started,) = agent.bus.of(ShardStarted)
    assert (started.attempt, started.pid) == (2, warm.pid)
    warm.process.end(0)
    await agent.until(lambda: agent.bus.of(ShardCompleted))


@pytest.mark.parametrize(
    ("code", "warmed"),
    [
        pytest.param(exitcodes.COMM_ERROR, True, id="comm-error"),
        pytest.param(exitcodes.SYNC_TIMEOUT, True, id="sync-timeout"),
        pytest.param(-9, True, id="killed"),
        pytest.param(exitcodes.USER_ERROR, False, id="user-error-ends-the-job"),
        pytest.param(exitcodes.OOM, False, id="oom-keeps-the-job-off-this-node"),
        pytest.param(exitcodes.OK, False, id="completed"),
    ],
)
async def test_a_failure_the_gang_recovers_from_warms_a_standby(tmp_path: Path, code: int, warmed: bool) -> None:
    agent = Agent(tmp_path)
    agent.inputs()
    await agent.handlers.on_assignment(assignment())

    agent.launcher.processes[0].end(code)
    await agent.until(lambda: not agent.handlers.tasks)
    await asyncio.sleep(0)  # the standby's start is a task of its own

    assert len(agent.launcher.standbys) == (1 if warmed else 0)
    if warmed:
        await agent.handlers.on_assignment(assignment(attempt=2))
        assert len(agent.launcher.specs) == 1  # only attempt 1 started cold
        assert agent.launcher.standbys[0].orders[0].env["SHARDYARD_ATTEMPT"] == "2"


async def test_a_dead_standby_falls_back_to_a_cold_start(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    agent.inputs()
    await agent.handlers.on_assignment(spare())
    (warm,) = await agent.until(lambda: agent.launcher.standbys)
    warm.dead = True

    await agent.handlers.on_assignment(assignment(shard_index=1, attempt=2, gpu_indices=(1,)))

    (spec,) = agent.launcher.specs
    assert spec.env["SHARDYARD_ATTEMPT"] == "2"
    assert warm.orders == []


async def test_a_standby_that_died_idle_is_forgotten_and_frees_its_room(tmp_path: Path) -> None:
    agent = Agent(tmp_path)  # two GPUs: room for two standbys
    agent.inputs()
    for job in ("job-1", "job-2"):
        await agent.handlers.on_assignment(spare(job_id=job))
    first, _ = await agent.until(lambda: len(agent.launcher.standbys) == 2 and agent.launcher.standbys)
    first.dead = True

    await agent.handlers.heartbeat()
    await agent.handlers.on_assignment(spare(job_id="job-3"))
    await asyncio.sleep(0)

    assert first.discarded
    assert [s.spec.log_path.parent.name for s in agent.launcher.standbys] == ["job-1", "job-2", "job-3"]


async def test_standbys_end_with_their_job_or_their_time_and_are_never_more_than_the_gpus(tmp_path: Path) -> None:
    agent = Agent(tmp_path)  # two GPUs
    agent.inputs()
    for job in ("job-1", "job-2", "job-3"):
        await agent.handlers.on_assignment(spare(job_id=job))
    first, second = await agent.until(lambda: len(agent.launcher.standbys) == 2 and agent.launcher.standbys)
    await asyncio.sleep(0)
    assert len(agent.launcher.standbys) == 2  # job-3 gets none: the node has two GPUs

    await agent.handlers.on_lifecycle(
        JobSucceeded(occurred_at=T0, job_id="job-1", attempt=1, final_loss=None, checkpoint_dir=None)
    )
    assert (first.discarded, second.discarded) == (True, False)

    agent.clock.mono = 120.0
    await agent.handlers.heartbeat()
    assert not second.discarded  # job-2 still holds its spare here

    await agent.handlers.on_assignment(
        ShardRevocation(
            occurred_at=T0,
            job_id="job-2",
            shard_index=1,
            node_id="node-a",
            attempt=1,
            term=1,
            reason=RevocationReason.JOB_SUCCEEDED,
        )
    )
    await agent.handlers.heartbeat()
    assert second.discarded


async def test_entrypoint_jobs_and_agents_without_standbys_start_cold(tmp_path: Path) -> None:
    agent = Agent(tmp_path, standbys="none")
    agent.inputs()
    await agent.handlers.on_assignment(spare())
    await agent.handlers.on_assignment(assignment())
    agent.launcher.processes[0].end(exitcodes.COMM_ERROR)
    await agent.until(lambda: not agent.handlers.tasks)
    await asyncio.sleep(0)
    assert agent.launcher.standbys == []

    entry = Agent(tmp_path / "entry")
    entry.inputs()
    command = workload(entrypoint=Entrypoint(command=["python", "train.py"]))
    await entry.handlers.on_assignment(spare(workload=command))
    await asyncio.sleep(0)
    assert entry.launcher.standbys == []


async def test_shutdown_discards_the_standbys(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    agent.inputs()
    await agent.handlers.on_assignment(spare())
    (warm,) = await agent.until(lambda: agent.launcher.standbys)

    await agent.handlers.stop_all()

    assert warm.discarded


async def test_in_gang_mode_every_training_member_of_a_gang_keeps_a_standby(tmp_path: Path) -> None:
    agent = Agent(tmp_path, standbys="gang")
    agent.inputs()
    await agent.handlers.on_assignment(assignment())  # shard 0 of 2
    await agent.handlers.on_assignment(assignment(job_id="solo", world_size=1))
    (gang, solo) = agent.launcher.processes
    for process in (gang, solo):
        process.report(kind="progress", step=1, cpu_percent=90.0)
    await agent.until(lambda: len(agent.handlers.book.utilization) == 2)
    agent.clock.mono = 4.9
    gang.report(kind="progress", step=100, cpu_percent=90.0)
    await agent.until(lambda: agent.bus.of(ShardProgress)[-1].step == 100)
    assert agent.launcher.standbys == []  # not in its first 5 s of training

    agent.clock.mono = 5.0
    for process in (gang, solo, gang):
        process.report(kind="progress", step=200, cpu_percent=90.0)
    await agent.until(lambda: len([p for p in agent.bus.of(ShardProgress) if p.step == 200]) == 3)
    await asyncio.sleep(0)

    (warm,) = agent.launcher.standbys  # one for the gang's shard here; none for a 1-shard job, none twice
    assert warm.spec.log_path.parent.name == "job-1"
    agent.clock.mono = 605.0
    await agent.handlers.heartbeat()
    assert not warm.discarded  # it lives while the gang trains here

    gang.end(exitcodes.COMM_ERROR)  # the warm one is already here: a failure starts no second one
    await agent.until(lambda: agent.bus.of(ShardFailed))
    await asyncio.sleep(0)
    assert len(agent.launcher.standbys) == 1
    await agent.handlers.on_assignment(assignment(attempt=2))
    assert warm.orders[0].env["SHARDYARD_ATTEMPT"] == "2"
    solo.end(0)
    warm.process.end(0)
    await agent.until(lambda: not agent.handlers.tasks)


async def test_a_reformed_gangs_shard_starts_once_the_older_attempt_here_has_exited(tmp_path: Path) -> None:
    """Two attempts of a job never run at once on a node, and the old one keeps its gang's state before the new one
    looks for it."""
    kept = tmp_path / "peer-state"
    agent = Agent(tmp_path, standbys="none", peer_state_dir=kept)
    agent.inputs()
    await agent.handlers.on_assignment(assignment())
    (old,) = agent.launcher.processes
    assert agent.launcher.specs[0].env[PEER_STATE_DIR_ENV] == str(kept / "job-1")

    new = asyncio.create_task(agent.handlers.on_assignment(assignment(attempt=2)))
    await asyncio.sleep(0.05)
    assert len(agent.launcher.specs) == 1 and not new.done()  # attempt 1 is still running here

    old.end(exitcodes.COMM_ERROR)
    await asyncio.wait_for(new, 5.0)
    assert [spec.env["SHARDYARD_ATTEMPT"] for spec in agent.launcher.specs] == ["1", "2"]
    assert agent.launcher.specs[1].env[PEER_STATE_DIR_ENV] == str(kept / "job-1")


async def test_the_kept_state_goes_with_its_job_and_entrypoints_get_none(tmp_path: Path) -> None:
    kept = tmp_path / "peer-state"
    agent = Agent(tmp_path, standbys="none", peer_state_dir=kept)
    agent.inputs()
    (kept / "job-1" / "rank-0").mkdir(parents=True)
    (kept / "job-2" / "rank-0").mkdir(parents=True)

    await agent.handlers.on_lifecycle(
        JobSucceeded(occurred_at=T0, job_id="job-1", attempt=1, final_loss=None, checkpoint_dir=None)
    )
    assert sorted(p.name for p in kept.iterdir()) == ["job-2"]

    command = workload(entrypoint=Entrypoint(command=["python", "train.py"]))
    await agent.handlers.on_assignment(assignment(job_id="job-3", workload=command))
    assert PEER_STATE_DIR_ENV not in agent.launcher.specs[0].env  # a job's own script keeps its own state


class SlowLauncher(FakeLauncher):
    """A launcher whose process starts only when the test says so (a cold start takes seconds: Python, torch)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    async def launch(self, spec: LaunchSpec, *, progress_env: str) -> FakeProcess:
        await self.go.wait()
        return await super().launch(spec, progress_env=progress_env)


async def test_a_shard_revoked_while_its_process_starts_is_terminated_once_it_has_one(tmp_path: Path) -> None:
    agent = Agent(tmp_path, standbys="none")
    agent.inputs()
    launcher = SlowLauncher()
    agent.handlers.supervisor.launcher = launcher
    starting = asyncio.create_task(agent.handlers.on_assignment(assignment(world_size=1)))
    await asyncio.sleep(0)  # the launch is under way

    await agent.handlers.on_assignment(
        ShardRevocation(
            occurred_at=T0,
            job_id="job-1",
            shard_index=0,
            node_id="node-a",
            attempt=1,
            term=1,
            reason=RevocationReason.RECOVERING,
        )
    )
    launcher.go.set()
    await asyncio.wait_for(starting, timeout=5)

    (process,) = launcher.processes
    assert process.exit.done() and process.exit.result() == -15  # terminated, not left to train
    await agent.until(lambda: not agent.handlers.tasks)
    assert not agent.bus.of(ShardCompleted) and not agent.bus.of(ShardFailed)  # a revoked shard's end is not reported


async def test_a_report_whose_cpu_figure_is_no_number_counts_as_zero_and_the_watch_goes_on(
    tmp_path: Path,
) -> None:
    agent = Agent(tmp_path, standbys="none")
    agent.inputs()
    await agent.handlers.on_assignment(assignment(world_size=1))
    (process,) = agent.launcher.processes
    process.report(kind="progress", step=10, loss=2.0, cpu_percent="lots")
    process.report(kind="finished", final_loss=1.5, steps=10, checkpoint_dir="/out")
    process.end(exitcodes.OK)

    (completed,) = await agent.until(lambda: agent.bus.of(ShardCompleted))
    assert completed.job_id == "job-1"
    assert agent.bus.of(ShardProgress)[-1].cpu_percent == 0.0
