"""A node's live telemetry (CPU load, each GPU's use), as its heartbeats and leases report it, and when it moved far
enough from what was last published to publish the node's state again. Pure."""

from dataclasses import dataclass

from shardyard.events import GpuStatus, Heartbeat, NodeLease


@dataclass(frozen=True)
class Tolerance:
    """How far a node's telemetry may move before its state is published again. Placement reads the load and GPU
    memory; the monitor shows these figures from the node state, to within these steps."""

    load: float = 0.05
    """CPU load, as a fraction of the node's cores."""
    gpu_utilization: float = 0.1
    gpu_memory: float = 0.05
    """GPU memory in use, as a fraction of the GPU's memory."""
    temperature_c: float = 5.0


@dataclass(frozen=True)
class Telemetry:
    cpu_load: float
    gpu_utilization: tuple[float, ...]
    gpu_memory_used_bytes: tuple[int, ...]
    gpu_temperature_c: tuple[float | None, ...]

    @classmethod
    def of(cls, heartbeat: Heartbeat) -> "Telemetry":
        gpus = heartbeat.gpus
        return cls(
            heartbeat.cpu_load,
            tuple(g.utilization for g in gpus),
            tuple(g.memory_used_bytes for g in gpus),
            tuple(g.temperature_c for g in gpus),
        )

    def renewed(self, lease: NodeLease) -> "Telemetry":
        """This telemetry as ``lease`` updates it. GPU figures that do not match the node's GPUs in number (a lease
        of an agent whose GPUs changed, before its full heartbeat says so) are not taken."""
        if (
            lease.cpu_load == self.cpu_load
            and lease.gpu_utilization == self.gpu_utilization
            and lease.gpu_memory_used_bytes == self.gpu_memory_used_bytes
            and lease.gpu_temperature_c == self.gpu_temperature_c
        ):
            return self  # the usual lease: nothing moved
        count = len(self.gpu_utilization)
        if len(lease.gpu_utilization) == len(lease.gpu_memory_used_bytes) == len(lease.gpu_temperature_c) == count:
            return Telemetry(
                lease.cpu_load, lease.gpu_utilization, lease.gpu_memory_used_bytes, lease.gpu_temperature_c
            )
        return Telemetry(lease.cpu_load, self.gpu_utilization, self.gpu_memory_used_bytes, self.gpu_temperature_c)

    def gpus(self, gpus: tuple[GpuStatus, ...]) -> tuple[GpuStatus, ...]:
        """``gpus`` (a full heartbeat's) with these live figures."""
        if Telemetry.of_gpus(gpus) == (self.gpu_utilization, self.gpu_memory_used_bytes, self.gpu_temperature_c):
            return gpus
        return tuple(
            gpu.model_copy(update={"utilization": used, "memory_used_bytes": memory, "temperature_c": hot})
            for gpu, used, memory, hot in zip(
                gpus, self.gpu_utilization, self.gpu_memory_used_bytes, self.gpu_temperature_c, strict=True
            )
        )

    @staticmethod
    def of_gpus(gpus: tuple[GpuStatus, ...]) -> tuple[tuple[float, ...], tuple[int, ...], tuple[float | None, ...]]:
        return (
            tuple(g.utilization for g in gpus),
            tuple(g.memory_used_bytes for g in gpus),
            tuple(g.temperature_c for g in gpus),
        )


def _past(change: float, step: float) -> bool:
    return abs(change) >= step * (1 - 1e-9)  # 0.15 - 0.10 is a whole step of 0.05, float rounding aside


def moved(now: Telemetry, then: Telemetry, memory: tuple[int, ...], tolerance: Tolerance) -> bool:
    """Whether ``now`` moved past ``tolerance`` from ``then``; ``memory`` is each GPU's installed memory."""
    if _past(now.cpu_load - then.cpu_load, tolerance.load):
        return True
    if len(now.gpu_utilization) != len(then.gpu_utilization):
        return True
    for used, was in zip(now.gpu_utilization, then.gpu_utilization, strict=True):
        if _past(used - was, tolerance.gpu_utilization):
            return True
    for size, used_bytes, was_bytes in zip(memory, now.gpu_memory_used_bytes, then.gpu_memory_used_bytes, strict=False):
        if _past(used_bytes - was_bytes, tolerance.gpu_memory * max(size, 1)):
            return True
    for hot, was_hot in zip(now.gpu_temperature_c, then.gpu_temperature_c, strict=True):
        if (hot is None) != (was_hot is None):
            return True
        if hot is not None and was_hot is not None and _past(hot - was_hot, tolerance.temperature_c):
            return True
    return False
