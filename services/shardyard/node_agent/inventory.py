"""What GPUs a node has: NVML when a GPU and its driver are present, else the node's declared simulated GPUs.

``GpuProbe`` is the seam: the agent asks ``probe(busy)`` for the current status of every GPU.
"""

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Protocol

from shardyard.errors import ConfigError
from shardyard.events import GpuStatus
from shardyard.gpus import DEFAULT_TFLOPS, canonical_model

log = logging.getLogger(__name__)

_DECLARED = re.compile(r"^\s*([A-Za-z0-9_-]+?)\s*(?:[:x*]\s*(\d+))?\s*(?:@\s*(\d+)\s*GiB)?\s*$")
DEFAULT_GPU_MEMORY_GIB = 80


class GpuProbe(Protocol):
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
            )
            for index, (model, tflops, memory) in enumerate(self._gpus)
        )


class NvmlGpus:
    """Real GPUs through NVML (``nvidia-ml-py``)."""

    def __init__(self, catalogue: Mapping[str, float] = DEFAULT_TFLOPS) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._count = pynvml.nvmlDeviceGetCount()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError...
            raise GpuProbeUnavailable(str(exc)) from exc
        if self._count == 0:
            raise GpuProbeUnavailable("NVML reports no GPU")
        self._nvml = pynvml
        self._catalogue = catalogue

    def probe(self, utilization: Mapping[int, float]) -> tuple[GpuStatus, ...]:
        nvml = self._nvml
        out = []
        for index in range(self._count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(handle)
            model = canonical_model(name if isinstance(name, str) else name.decode())
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            temperature = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            out.append(
                GpuStatus(
                    index=index,
                    model=model,
                    tflops=self._catalogue.get(model, 1.0),
                    memory_bytes=int(memory.total),
                    memory_used_bytes=int(memory.used),
                    utilization=float(rates.gpu) / 100.0,
                    temperature_c=float(temperature),
                )
            )
        return tuple(out)


def detect(declared: Sequence[str], catalogue: Mapping[str, float] = DEFAULT_TFLOPS) -> GpuProbe:
    """NVML if it finds GPUs, else the declared simulated inventory (which may be empty: a CPU-only node)."""
    try:
        probe = NvmlGpus(catalogue)
    except GpuProbeUnavailable as exc:
        log.info("NVML unavailable (%s); using the declared simulated GPUs %s", exc, list(declared))
        return SimulatedGpus(declared, catalogue)
    if declared:
        log.warning("NVML found real GPUs; ignoring the declared simulated GPUs %s", list(declared))
    return probe
