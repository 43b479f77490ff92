"""GPU health: a GPU is faulted once NVML reports a critical Xid on it or its uncorrected ECC error count grows.

``GpuHealth`` is the pure part: fed readings, it says which GPUs are faulted and why. ``NvmlHealthReader`` feeds it
from NVML on every probe (every heartbeat) and never waits: Xid events are polled with a 0 ms timeout.

A fault is sticky for the agent's life. NVML reports no recovery, and a GPU that raised one of these Xids or lost
data to ECC needs a reset (often a node reboot) before it can be trusted again; the operator restarts the agent after
that, which gives the GPU a clean slate.
"""

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

log = logging.getLogger(__name__)

CRITICAL_XIDS: Final[Mapping[int, str]] = MappingProxyType(
    {
        48: "double bit ECC error",
        62: "internal micro-controller halt",
        63: "ECC page retirement or row remapping recording event",
        64: "ECC page retirement or row remapper recording failure",
        74: "NVLink error",
        79: "GPU has fallen off the bus",
        92: "high single-bit ECC error rate",
        94: "contained ECC error",
        95: "uncontained ECC error",
        119: "GSP RPC timeout",
        120: "GSP error",
    }
)
"""Xids that mean the GPU itself is broken or must be reset, named as in NVIDIA's Xid catalogue
(https://docs.nvidia.com/deploy/xid-errors/). The Xids the catalogue blames on the application, or on the driver
cleaning up after one (13 graphics engine exception, 31 memory page fault, 43 GPU stopped processing, 45 preemptive
cleanup), leave the GPU healthy: the shard that caused them fails by itself and the GPU can take the next one."""

MAX_EVENTS_PER_READ: Final = 64
"""Xid events taken per read at most: a GPU raising a storm of them cannot hold up the heartbeat (the rest wait in
NVML's queue for the next read)."""


@dataclass
class GpuHealth:
    """Which GPUs are faulted and why, from the readings it is fed. Pure."""

    faults: dict[int, str] = field(default_factory=dict)
    """GPU index -> its first fault (the root cause; later ones are consequences). Never forgotten."""
    ecc_counts: dict[int, int] = field(default_factory=dict)
    """GPU index -> its last uncorrected ECC error count."""

    def xid(self, index: int, code: int) -> str | None:
        """An Xid event on GPU ``index``: the new fault when it is a critical one and the GPU was healthy."""
        name = CRITICAL_XIDS.get(code)
        return None if name is None else self.mark(index, f"Xid {code}: {name}")

    def ecc(self, index: int, uncorrected: int) -> str | None:
        """GPU ``index``'s volatile uncorrected ECC error count: the new fault when it grew since the last reading.

        The first reading is the baseline: errors from before the agent started were acted on (or not) back then, and
        counting them again on every agent restart would keep a GPU out of use until its next reset."""
        previous = self.ecc_counts.get(index)
        self.ecc_counts[index] = uncorrected
        if previous is None or uncorrected <= previous:
            return None
        grew = uncorrected - previous
        return self.mark(index, f"{grew} uncorrected ECC error{'s' if grew > 1 else ''}")

    def mark(self, index: int, fault: str) -> str | None:
        """GPU ``index`` is faulted: ``fault`` when that is new, None when it was faulted already."""
        if index in self.faults:
            return None
        self.faults[index] = fault
        return fault

    def fault(self, index: int) -> str | None:
        return self.faults.get(index)


class NvmlHealthReader:
    """Feeds a :class:`GpuHealth` from NVML: the critical Xid events since the last read, then every GPU's volatile
    uncorrected ECC count. Every NVML error is a missing reading, never a failed probe: GPUs without ECC (or with it
    switched off) and devices that cannot deliver events are simply watched through what they do support."""

    def __init__(self, nvml: Any, handles: Sequence[Any], health: GpuHealth | None = None) -> None:
        self.nvml = nvml
        self.handles = tuple(handles)
        self.health = health or GpuHealth()
        self._events = self._register()

    def _register(self) -> Any:
        """An event set with every GPU that can deliver Xid events registered in it; None when NVML has none."""
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.info("no NVML events (%s): GPU health from ECC counts only", exc)
            return None
        for index, handle in enumerate(self.handles):
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
            except nvml.NVMLError as exc:
                log.info("GPU %d delivers no Xid events (%s): its health from ECC counts only", index, exc)
        return events

    def read(self) -> Mapping[int, str]:
        """Take the pending readings; the faulted GPUs (index -> fault)."""
        self._read_xids()
        for index, handle in enumerate(self.handles):
            count = self._uncorrected_ecc(handle)
            if count is not None:
                self._log(index, self.health.ecc(index, count))
        return self.health.faults

    def _read_xids(self) -> None:
        nvml = self.nvml
        if self._events is None:
            return
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                data = wait(self._events, 0)
            except nvml.NVMLError_Timeout:
                return  # nothing pending
            except nvml.NVMLError as exc:  # e.g. GPU is lost: the probe finds out which one
                log.debug("NVML event wait failed: %s", exc)
                return
            if data.eventType != nvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                index = nvml.nvmlDeviceGetIndex(data.device)
            except nvml.NVMLError as exc:
                log.warning("Xid %d on a GPU NVML cannot name (%s): ignored", data.eventData, exc)
                continue
            code = int(data.eventData)
            if code not in CRITICAL_XIDS:
                log.info("GPU %d: Xid %d (not one that faults the GPU)", index, code)
            self._log(index, self.health.xid(index, code))

    def _uncorrected_ecc(self, handle: Any) -> int | None:
        nvml = self.nvml
        try:
            return int(
                nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
            )
        except nvml.NVMLError:  # ECC not supported or switched off
            return None

    def mark(self, index: int, fault: str) -> None:
        """A fault the readings cannot see (the probe's own: the GPU is lost)."""
        self._log(index, self.health.mark(index, fault))

    def fault(self, index: int) -> str | None:
        return self.health.fault(index)

    @staticmethod
    def _log(index: int, fault: str | None) -> None:
        if fault is not None:
            log.warning("GPU %d faulted: %s; it takes no new shards until the agent restarts", index, fault)
