"""What GPUs a node has: NVML when a GPU and its driver are present, else the node's declared simulated GPUs.

``GpuProbe`` is the seam: the agent asks ``probe(busy)`` for the current status of every GPU, its health included
(see ``gpu_health.py``). ``MeasuredTflops`` wraps a probe to report start-up benchmark figures (see ``benchmark.py``)
instead of the catalogue's.
"""

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from shardyard.errors import ConfigError
from shardyard.events import GpuStatus
from shardyard.gpus import DEFAULT_TFLOPS, canonical_model
from shardyard.node_agent.gpu_health import GpuHealth, NvmlHealthReader

log = logging.getLogger(__name__)

_DECLARED = re.compile(r"^\s*([A-Za-z0-9_-]+?)\s*(?:[:x*]\s*(\d+))?\s*(?:@\s*(\d+)\s*GiB)?\s*$")
DEFAULT_GPU_MEMORY_GIB = 80


class GpuProbe(Protocol):
    @property
    def simulated(self) -> bool:
        """True for declared GPUs (several simulated nodes may share one host), False for real ones."""
        ...

    def uuids(self) -> tuple[str | None, ...]:
        """A stable hardware id per GPU index (NVML's UUID); None where there is none (simulated GPUs)."""
        ...

    def probe(self, utilization: Mapping[int, float]) -> tuple[GpuStatus, ...]:
        """Every GPU's status; ``utilization`` is the agent's own view of busy GPUs (used where nothing measures)."""
        ...


class GpuProbeUnavailable(Exception):
    """NVML cannot be used on this machine (no driver, no GPU)."""


class SimulatedGpus:
    """GPUs declared on the command line, e.g. ``A100:2`` or ``V100x4@32GiB``; their load follows their shards."""

    def __init__(self, declared: Sequence[str], catalogue: Mapping[str, float] = DEFAULT_TFLOPS) -> None:
        gpus: list[tuple[str, float, int]] = []
        for item in declared:
            match = _DECLARED.match(item)
            if match is None:
                raise ConfigError(f"cannot read GPU declaration {item!r}; write MODEL[:COUNT][@MEMGiB], e.g. A100:2")
            model = canonical_model(match.group(1))
            if model not in catalogue:
                raise ConfigError(f"unknown GPU model {match.group(1)!r}; known: {', '.join(sorted(catalogue))}")
            count = int(match.group(2) or 1)
            memory = int(match.group(3) or DEFAULT_GPU_MEMORY_GIB) * 1024**3
            gpus.extend((model, catalogue[model], memory) for _ in range(count))
        self._gpus = gpus
        self.health = GpuHealth()

    def inject_fault(self, index: int, fault: str) -> None:
        """GPU ``index`` faults as a real one would on an Xid or an ECC error (tests, chaos drills)."""
        if not 0 <= index < len(self._gpus):
            raise IndexError(f"no simulated GPU {index} (this node has {len(self._gpus)})")
        self.health.mark(index, fault)

    @property
    def simulated(self) -> bool:
        return True

    def uuids(self) -> tuple[str | None, ...]:
        return (None,) * len(self._gpus)

    def probe(self, utilization: Mapping[int, float]) -> tuple[GpuStatus, ...]:
        return tuple(
            GpuStatus(
                index=index,
                model=model,
                tflops=tflops,
                memory_bytes=memory,
                memory_used_bytes=int(memory * 0.5) if index in utilization else 0,
                utilization=min(1.0, max(0.0, utilization.get(index, 0.0))),
                temperature_c=40.0 + 35.0 * utilization.get(index, 0.0),
                simulated=True,
                healthy=self.health.fault(index) is None,
                fault=self.health.fault(index),
            )
            for index, (model, tflops, memory) in enumerate(self._gpus)
        )


class NvmlGpus:
    """Real GPUs through NVML (``nvidia-ml-py``); ``nvml`` stands in for the ``pynvml`` module (tests)."""

    def __init__(self, catalogue: Mapping[str, float] = DEFAULT_TFLOPS, nvml: Any = None) -> None:
        try:
            if nvml is None:
                import pynvml

                nvml = pynvml
            nvml.nvmlInit()
            self._count = nvml.nvmlDeviceGetCount()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError...
            raise GpuProbeUnavailable(str(exc)) from exc
        if self._count == 0:
            raise GpuProbeUnavailable("NVML reports no GPU")
        self._nvml = nvml
        self._catalogue = catalogue
        self._handles = tuple(nvml.nvmlDeviceGetHandleByIndex(index) for index in range(self._count))
        self._health = NvmlHealthReader(nvml, self._handles)
        self._last: dict[int, GpuStatus] = {}

    @property
    def simulated(self) -> bool:
        return False

    def uuids(self) -> tuple[str | None, ...]:
        out: list[str | None] = []
        for handle in self._handles:
            uuid = self._nvml.nvmlDeviceGetUUID(handle)
            out.append(uuid if isinstance(uuid, str) else uuid.decode())
        return tuple(out)

    def probe(self, utilization: Mapping[int, float]) -> tuple[GpuStatus, ...]:
        self._health.read()
        return tuple(self._status(index, handle) for index, handle in enumerate(self._handles))

    def _status(self, index: int, handle: Any) -> GpuStatus:
        """One GPU's readings and health. A GPU that fell off the bus answers nothing but "GPU is lost": it is
        reported faulted with its last readings, so that one lost GPU does not silence the whole node."""
        try:
            status = self._read(index, handle)
        except self._nvml.NVMLError_GpuIsLost:
            last = self._last.get(index)
            if last is None:
                raise
            self._health.mark(index, "GPU is lost (NVML)")
            status = last
        self._last[index] = status
        fault = self._health.fault(index)
        return status if fault is None else status.model_copy(update={"healthy": False, "fault": fault})

    def _read(self, index: int, handle: Any) -> GpuStatus:
        nvml = self._nvml
        name = nvml.nvmlDeviceGetName(handle)
        model = canonical_model(name if isinstance(name, str) else name.decode())
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        rates = nvml.nvmlDeviceGetUtilizationRates(handle)
        temperature = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        return GpuStatus(
            index=index,
            model=model,
            tflops=self._catalogue.get(model, 1.0),
            memory_bytes=int(memory.total),
            memory_used_bytes=int(memory.used),
            utilization=float(rates.gpu) / 100.0,
            temperature_c=float(temperature),
        )


class MeasuredTflops:
    """A probe whose GPUs report measured TFLOPS (``tflops_source="measured"``) where ``figures`` has one by index."""

    def __init__(self, inner: GpuProbe, figures: Mapping[int, float] | None = None) -> None:
        self.inner = inner
        self.figures: dict[int, float] = dict(figures or {})

    @property
    def simulated(self) -> bool:
        return self.inner.simulated

    def uuids(self) -> tuple[str | None, ...]:
        return self.inner.uuids()

    def probe(self, utilization: Mapping[int, float]) -> tuple[GpuStatus, ...]:
        return tuple(
            gpu.model_copy(update={"tflops": self.figures[gpu.index], "tflops_source": "measured"})
            if gpu.index in self.figures
            else gpu
            for gpu in self.inner.probe(utilization)
        )


GpuProbeChoice = Literal["auto", "nvml", "simulated"]


def detect(
    declared: Sequence[str], catalogue: Mapping[str, float] = DEFAULT_TFLOPS, *, choice: GpuProbeChoice = "auto"
) -> GpuProbe:
    """NVML if it finds GPUs, else the declared simulated inventory (which may be empty: a CPU-only node).
    ``choice``: ``simulated`` takes the declared inventory without asking NVML; ``nvml`` raises
    :class:`GpuProbeUnavailable` where NVML finds none, instead of falling back."""
    if choice == "simulated":
        log.info("using the declared simulated GPUs %s (gpu_probe=simulated)", list(declared))
        return SimulatedGpus(declared, catalogue)
    try:
        probe = NvmlGpus(catalogue)
    except GpuProbeUnavailable as exc:
        if choice == "nvml":
            raise
        log.info("NVML unavailable (%s); using the declared simulated GPUs %s", exc, list(declared))
        return SimulatedGpus(declared, catalogue)
    if declared:
        log.warning("NVML found real GPUs; ignoring the declared simulated GPUs %s", list(declared))
    return probe
