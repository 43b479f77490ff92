"""GPU health: the pure tracker (critical Xids, uncorrected ECC errors, sticky faults), NVML read through a fake
``pynvml``, the agent failing a faulted GPU's shards as GPU_FAULT, and the scheduler leaving unhealthy GPUs alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from shardyard.events import (
    FailureCause,
    GpuStatus,
    JobReady,
    JobScheduled,
    JobUnschedulable,
    ShardCompleted,
    ShardFailed,
    ShardStarted,
)
from shardyard.node_agent.book import AgentBook
from shardyard.node_agent.gpu_health import CRITICAL_XIDS, GpuHealth
from shardyard.node_agent.inventory import GpuProbeUnavailable, MeasuredTflops, NvmlGpus, SimulatedGpus
from shardyard.scheduler.book import SchedulerBook
from shardyard.training import exitcodes
from tests.unit.agent.test_agent_handlers import Agent
from tests.unit.builders import GIB, T0, assignment, at, gpus, job_spec, node_state

XID_79 = "Xid 79: GPU has fallen off the bus"

# --- the tracker -------------------------------------------------------------------------------------------------


def test_the_documented_critical_xids_are_all_faults() -> None:
    assert {48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120} <= set(CRITICAL_XIDS)


@pytest.mark.parametrize(
    ("code", "fault"),
    [
        pytest.param(79, XID_79, id="fallen-off-the-bus"),
        pytest.param(48, "Xid 48: double bit ECC error", id="double-bit-ecc"),
        pytest.param(95, "Xid 95: uncontained ECC error", id="uncontained-ecc"),
        pytest.param(119, "Xid 119: GSP RPC timeout", id="gsp-timeout"),
        pytest.param(13, None, id="graphics-engine-exception-is-the-application"),
        pytest.param(31, None, id="memory-page-fault-is-the-application"),
        pytest.param(43, None, id="stopped-processing-is-the-application"),
        pytest.param(45, None, id="preemptive-cleanup"),
    ],
)
def test_critical_xids_fault_the_gpu_others_do_not(code: int, fault: str | None) -> None:
    health = GpuHealth()

    assert health.xid(1, code) == fault
    assert health.fault(1) == fault
    assert health.fault(0) is None


@pytest.mark.parametrize(
    ("readings", "fault"),
    [
        pytest.param([0, 0, 0], None, id="no-errors"),
        pytest.param([3, 3], None, id="errors-before-the-agent-started-are-the-baseline"),
        pytest.param([0, 2], "2 uncorrected ECC errors", id="two-new"),
        pytest.param([5, 6], "1 uncorrected ECC error", id="one-new"),
        pytest.param([4, 0, 0], None, id="counter-reset-is-a-new-baseline"),
        pytest.param([4, 0, 1], "1 uncorrected ECC error", id="growth-after-a-reset"),
    ],
)
def test_uncorrected_ecc_errors_fault_the_gpu_when_their_count_grows(readings: list[int], fault: str | None) -> None:
    health = GpuHealth()

    news = [health.ecc(0, count) for count in readings]

    assert health.fault(0) == fault
    assert [n for n in news if n is not None] == ([fault] if fault else [])


def test_a_faulted_gpu_stays_faulted_with_its_first_fault() -> None:
    health = GpuHealth()
    health.ecc(0, 0)
    assert health.xid(0, 79) == XID_79

    assert health.ecc(0, 7) is None  # a consequence, not news
    assert health.xid(0, 48) is None
    assert health.ecc(0, 7) is None
    assert health.mark(0, "GPU is lost (NVML)") is None

    assert health.faults == {0: XID_79}


# --- NVML through a fake pynvml ----------------------------------------------------------------------------------


class NVMLError(Exception):
    pass


class NVMLErrorTimeout(NVMLError):
    pass


class NVMLErrorNotSupported(NVMLError):
    pass


class NVMLErrorGpuIsLost(NVMLError):
    pass


@dataclass
class EventData:
    device: str
    eventType: int  # pynvml's field names
    eventData: int


@dataclass
class FakeNvml:
    """The slice of ``pynvml`` that ``NvmlGpus`` uses: A100s with an ECC counter each and one Xid event queue."""

    count: int = 2
    no_ecc: bool = False
    no_event_set: bool = False
    no_events: set[int] = field(default_factory=set)
    """GPUs whose event registration fails (not supported)."""
    ecc: dict[int, int] = field(default_factory=dict)
    lost: set[int] = field(default_factory=set)
    events: list[EventData] = field(default_factory=list)
    registered: set[int] = field(default_factory=set)
    waits: list[int] = field(default_factory=list)
    wait_error: NVMLError | None = None

    NVMLError = NVMLError
    NVMLError_Timeout = NVMLErrorTimeout
    NVMLError_GpuIsLost = NVMLErrorGpuIsLost
    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 0x8

    def xid(self, index: int, code: int) -> None:
        """The driver raises an Xid on GPU ``index``; it is queued only where the GPU was registered."""
        if index in self.registered:
            self.events.append(EventData(f"gpu-{index}", self.nvmlEventTypeXidCriticalError, code))

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu-{index}"

    def nvmlDeviceGetIndex(self, handle: str) -> int:
        return int(handle.removeprefix("gpu-"))

    def _answer(self, handle: str) -> None:
        if self.nvmlDeviceGetIndex(handle) in self.lost:
            raise NVMLErrorGpuIsLost("GPU is lost")

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        return f"GPU-{handle}"

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        self._answer(handle)
        return b"NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        self._answer(handle)
        return SimpleNamespace(total=80 * GIB, used=10 * GIB)

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        self._answer(handle)
        return SimpleNamespace(gpu=50)

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        self._answer(handle)
        return 61

    def nvmlDeviceGetTotalEccErrors(self, handle: str, error_type: int, counter_type: int) -> int:
        assert (error_type, counter_type) == (self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, self.NVML_VOLATILE_ECC)
        self._answer(handle)
        if self.no_ecc:
            raise NVMLErrorNotSupported("Not Supported")
        return self.ecc.get(self.nvmlDeviceGetIndex(handle), 0)

    def nvmlEventSetCreate(self) -> str:
        if self.no_event_set:
            raise NVMLErrorNotSupported("Not Supported")
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: str, event_types: int, event_set: str) -> None:
        assert (event_types, event_set) == (self.nvmlEventTypeXidCriticalError, "event-set")
        index = self.nvmlDeviceGetIndex(handle)
        if index in self.no_events:
            raise NVMLErrorNotSupported("Not Supported")
        self.registered.add(index)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> EventData:
        self.waits.append(timeout_ms)
        if self.wait_error is not None:
            raise self.wait_error
        if not self.events:
            raise NVMLErrorTimeout("Timeout")
        return self.events.pop(0)


def health(statuses: tuple[GpuStatus, ...]) -> list[tuple[bool, str | None]]:
    return [(g.healthy, g.fault) for g in statuses]


def test_nvml_gpus_are_healthy_until_they_fault_and_reads_never_wait() -> None:
    nvml = FakeNvml()
    probe = NvmlGpus(nvml=nvml)

    first = probe.probe({})

    assert health(first) == [(True, None), (True, None)]
    readings = [(g.model, g.memory_bytes, g.memory_used_bytes, g.utilization, g.temperature_c) for g in first]
    assert readings == [("A100", 80 * GIB, 10 * GIB, 0.5, 61.0)] * 2
    assert nvml.registered == {0, 1}
    assert probe.uuids() == ("GPU-gpu-0", "GPU-gpu-1")
    assert set(nvml.waits) == {0}


def test_a_critical_xid_faults_its_gpu_for_good_and_others_are_ignored() -> None:
    nvml = FakeNvml()
    probe = NvmlGpus(nvml=nvml)
    probe.probe({})

    nvml.xid(0, 13)  # the application's
    nvml.xid(1, 79)
    assert health(probe.probe({})) == [(True, None), (False, XID_79)]

    assert health(probe.probe({})) == [(True, None), (False, XID_79)]  # no new event: still faulted
    assert nvml.events == []


def test_a_growing_uncorrected_ecc_count_faults_the_gpu() -> None:
    nvml = FakeNvml(ecc={0: 1})
    probe = NvmlGpus(nvml=nvml)
    assert health(probe.probe({})) == [(True, None), (True, None)]

    nvml.ecc[0] = 3

    assert health(probe.probe({})) == [(False, "2 uncorrected ECC errors"), (True, None)]


def test_gpus_without_ecc_or_events_still_probe() -> None:
    nvml = FakeNvml(no_ecc=True, no_events={1})
    probe = NvmlGpus(nvml=nvml)

    nvml.xid(1, 79)  # not delivered: GPU 1 is not registered
    nvml.xid(0, 79)

    assert health(probe.probe({})) == [(False, XID_79), (True, None)]


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param({"no_event_set": True}, id="no-event-set"),
        pytest.param({"wait_error": NVMLErrorNotSupported("Unknown Error")}, id="wait-fails"),
    ],
)
def test_nvml_without_usable_events_still_probes(broken: dict[str, object]) -> None:
    probe = NvmlGpus(nvml=FakeNvml(**broken))  # type: ignore[arg-type]

    assert health(probe.probe({})) == [(True, None), (True, None)]


def test_a_lost_gpu_is_reported_faulted_with_its_last_readings() -> None:
    nvml = FakeNvml()
    probe = NvmlGpus(nvml=nvml)
    probe.probe({})

    nvml.lost.add(1)
    _, lost = probe.probe({})

    assert (lost.healthy, lost.fault, lost.model, lost.memory_bytes) == (False, "GPU is lost (NVML)", "A100", 80 * GIB)


def test_a_gpu_lost_before_its_first_reading_fails_the_probe() -> None:
    nvml = FakeNvml(lost={0})

    with pytest.raises(NVMLErrorGpuIsLost):
        NvmlGpus(nvml=nvml).probe({})


def test_no_nvml_means_no_probe() -> None:
    with pytest.raises(GpuProbeUnavailable, match="no GPU"):
        NvmlGpus(nvml=FakeNvml(count=0))


def test_a_simulated_gpu_can_be_faulted_and_the_measured_figures_keep_it() -> None:
    simulated = SimulatedGpus(["A100:2"])
    probe = MeasuredTflops(simulated, {1: 21.5})

    simulated.inject_fault(1, XID_79)
    simulated.inject_fault(1, "2 uncorrected ECC errors")

    assert health(probe.probe({})) == [(True, None), (False, XID_79)]
    with pytest.raises(IndexError):
        simulated.inject_fault(2, XID_79)


def test_old_events_without_health_are_healthy() -> None:
    gpu = GpuStatus.model_validate({"index": 0, "model": "A100", "tflops": 35.0, "memory_bytes": GIB})

    assert (gpu.healthy, gpu.fault) == (True, None)


# --- the agent ---------------------------------------------------------------------------------------------------


async def test_a_faulted_gpu_fails_the_shards_on_it_as_gpu_faults(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = Agent(tmp_path)
    agent.inputs()
    for index in (0, 1):
        await agent.handlers.on_assignment(assignment(shard_index=index))
    healthy, faulty = agent.launcher.processes
    gpus = agent.handlers.gpus
    assert isinstance(gpus, SimulatedGpus)

    gpus.inject_fault(1, XID_79)
    await agent.handlers.heartbeat()
    await agent.handlers.heartbeat()  # the next beat stops nothing more

    assert faulty.exit.done() and faulty.exit.result() == -15
    (failed,) = await agent.until(lambda: agent.bus.of(ShardFailed))
    assert (failed.shard_index, failed.cause, failed.message) == (1, FailureCause.GPU_FAULT, f"GPU 1: {XID_79}")
    assert not healthy.exit.done()
    assert [(g.index, g.healthy, g.fault) for g in agent.beats()[-1].gpus] == [(0, True, None), (1, False, XID_79)]
    assert any("stopping" in r.message and XID_79 in r.message for r in caplog.records if r.levelname == "WARNING")
    healthy.end(0)
    await agent.until(lambda: not agent.handlers.tasks)
    assert len(agent.bus.of(ShardCompleted)) == 1


async def test_a_shard_started_after_its_gpu_faulted_is_stopped_by_the_next_heartbeat(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    agent.inputs()
    gpus = agent.handlers.gpus
    assert isinstance(gpus, SimulatedGpus)
    gpus.inject_fault(0, "2 uncorrected ECC errors")
    await agent.handlers.heartbeat()

    await agent.handlers.on_assignment(assignment(shard_index=0))  # placed before the scheduler heard
    await agent.handlers.heartbeat()

    (failed,) = await agent.until(lambda: agent.bus.of(ShardFailed))
    assert (failed.cause, failed.message) == (FailureCause.GPU_FAULT, "GPU 0: 2 uncorrected ECC errors")
    assert len(agent.bus.of(ShardStarted)) == 1


def book_running(*shards: tuple[int, tuple[int, ...]]) -> AgentBook:
    book = AgentBook("node-a")
    for shard_index, gpu_indices in shards:
        book.on_assignment(assignment(shard_index=shard_index, gpu_indices=gpu_indices))
    return book


def test_the_book_stops_started_shards_on_faulted_gpus_once() -> None:
    book = book_running((0, (0,)), (1, (1, 2)), (2, (3,)))
    started = set(book.running) - {("job-1", 2, 1)}
    faults = {1: XID_79, 2: "1 uncorrected ECC error", 3: XID_79}

    assert book.gpu_fault(faults, started) == [("job-1", 1, 1)]
    assert book.gpu_faulted == {("job-1", 1, 1): f"GPU 1: {XID_79}; GPU 2: 1 uncorrected ECC error"}
    assert book.gpu_fault(faults, started) == []
    assert book.gpu_fault(faults, set(book.running)) == [("job-1", 2, 1)]


@pytest.mark.parametrize(
    ("code", "fenced", "expected"),
    [
        pytest.param(-15, False, FailureCause.GPU_FAULT, id="terminated"),
        pytest.param(exitcodes.COMM_ERROR, False, FailureCause.GPU_FAULT, id="died-of-it-first"),
        pytest.param(-15, True, FailureCause.GPU_FAULT, id="fenced-too"),
        pytest.param(exitcodes.OK, False, ShardCompleted, id="finished-first"),
    ],
)
def test_the_end_of_a_shard_stopped_for_a_gpu_fault(code: int, fenced: bool, expected: object) -> None:
    book = book_running((0, (0,)))
    if fenced:
        book.fence("lost the bus")
    book.gpu_fault({0: XID_79}, set(book.running))

    event = book.finished(("job-1", 0, 1), code, now=T0, final=None, message=f"exit code {code}")

    if isinstance(expected, FailureCause):
        assert isinstance(event, ShardFailed)
        assert (event.cause, event.message, event.exit_code) == (expected, f"GPU 0: {XID_79}", code)
    else:
        assert isinstance(event, ShardCompleted)
    assert book.gpu_faulted == {}


# --- the scheduler -----------------------------------------------------------------------------------------------


def with_health(count: int, faulted: set[int]) -> tuple[GpuStatus, ...]:
    return tuple(
        g.model_copy(update={"healthy": False, "fault": XID_79}) if g.index in faulted else g for g in gpus(count=count)
    )


@pytest.mark.parametrize(
    ("count", "faulted", "free", "total"),
    [
        pytest.param(4, set(), (0, 1, 2, 3), 4, id="all-healthy"),
        pytest.param(4, {1}, (0, 2, 3), 3, id="one-faulted"),
        pytest.param(2, {0, 1}, (), 0, id="all-faulted"),
    ],
)
def test_an_unhealthy_gpu_is_not_free(count: int, faulted: set[int], free: tuple[int, ...], total: int) -> None:
    book = SchedulerBook(term=1)
    book.apply(node_state("node-a", gpus=with_health(count, faulted)))

    (view,) = book.snapshot().nodes

    assert (view.free_gpus, view.total_gpus) == (free, total)


def test_no_shard_is_placed_on_an_unhealthy_gpu() -> None:
    book = SchedulerBook(term=1)
    book.apply(node_state("node-a", gpus=with_health(3, {1})))
    book.apply(JobReady(occurred_at=at(0), job_id="job-1", spec=job_spec(gpu_count=2)))
    scheduled, *_ = book.cycle(at(1))

    assert isinstance(scheduled, JobScheduled)
    assert sorted(p.gpu_indices for p in scheduled.placements) == [(0,), (2,)]

    book.apply(JobReady(occurred_at=at(0), job_id="job-2", spec=job_spec(job_id="job-2", gpu_count=1)))
    assert any(isinstance(e, JobUnschedulable) for e in book.cycle(at(2)))
