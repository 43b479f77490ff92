"""Start-up TFLOPS measurement: a short square-matmul loop on each GPU, reported instead of the catalogue figure.

torch is imported only inside :func:`measure_matmul_tflops`, and the agent runs the measurement in a child process
(``python -m shardyard.node_agent.benchmark``, see :class:`SubprocessBench`): the agent itself never loads torch nor
keeps a CUDA context on every GPU (hundreds of MiB each that its shards would lose) for the rest of its life.
Which GPUs get measured is :func:`plan`'s decision; :func:`calibrate` carries it out through a :class:`GpuBench`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from shardyard.node_agent.inventory import GpuProbe

log = logging.getLogger(__name__)

MeasureMode = Literal["auto", "on", "off"]
MatmulDtype = Literal["float32", "tf32", "bfloat16", "float16"]
"""``float32``: strict IEEE FP32 (comparable with the catalogue's FP32 figures); ``tf32``: FP32 tensors on TF32
tensor cores; ``bfloat16`` / ``float16``: half-precision tensor cores."""

DEFAULT_SIZE = 4096
DEFAULT_SECONDS = 0.5
BENCH_MODULE = "shardyard.node_agent.benchmark"


def measure_matmul_tflops(
    device: str, *, size: int = DEFAULT_SIZE, dtype: MatmulDtype = "float32", seconds: float = DEFAULT_SECONDS
) -> float:
    """Multiply two ``size x size`` matrices on ``device`` for about ``seconds``; returns 2·n³ per matmul / time.

    After one warm-up product the loop runs in rounds (doubling in length, capped by the time left), synchronising
    the device after each round, until the time budget is spent; the figure covers every timed product.
    """
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds must be a finite number > 0, got {seconds}")
    import torch  # lazily: only a measuring process pays for it

    torch_dtype = {
        "float32": torch.float32,
        "tf32": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
    }[dtype]
    where = torch.device(device)

    def synchronize() -> None:
        if where.type == "cuda":
            torch.cuda.synchronize(where)

    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        generator = torch.Generator(device=where).manual_seed(0)
        a = torch.randn(size, size, device=where, dtype=torch_dtype, generator=generator)
        b = torch.randn(size, size, device=where, dtype=torch_dtype, generator=generator)
        out = torch.empty(size, size, device=where, dtype=torch_dtype)
        torch.matmul(a, b, out=out)  # warm-up: kernel choice, clocks, lazy allocations
        synchronize()
        done, batch = 0, 1
        t0 = time.perf_counter()
        while True:
            for _ in range(batch):
                torch.matmul(a, b, out=out)
            synchronize()
            done += batch
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                break
            per_product = elapsed / done  # double the round, but do not run far past the budget
            batch = max(1, min(2 * batch, math.ceil((seconds - elapsed) / per_product)))
    finally:
        torch.set_float32_matmul_precision(precision)
    return 2.0 * size**3 * done / elapsed / 1e12


@dataclass(frozen=True)
class BenchReport:
    tflops: Mapping[str, float] = field(default_factory=dict)
    """Measured TFLOPS by GPU UUID (normalised, see :func:`normal_uuid`)."""
    error: str | None = None
    """Why nothing (or not everything) was measured."""


class GpuBench(Protocol):
    async def measure(self) -> BenchReport:
        """Measure every GPU this machine's CUDA runtime sees."""
        ...


def normal_uuid(uuid: str) -> str:
    """NVML says ``GPU-8f3c...``, torch says ``8f3c...``: compare them without the prefix, in lower case."""
    text = uuid.strip().lower()
    return text.removeprefix("gpu-")


def plan(mode: MeasureMode, *, simulated: bool) -> tuple[bool, str]:
    """Whether to measure the node's GPUs, and why (for the log)."""
    if mode == "off":
        return False, "measure_tflops=off: catalogue figures"
    if simulated:
        if mode == "on":
            return False, (
                "measure_tflops=on, but the GPUs are simulated and a CPU figure would not describe them: "
                "keeping the catalogue figures"
            )
        return False, "simulated GPUs: catalogue figures"
    return True, f"measure_tflops={mode} with real GPUs: measuring"


async def calibrate(mode: MeasureMode, probe: GpuProbe, bench: GpuBench) -> dict[int, float]:
    """Measured TFLOPS by GPU index, for the GPUs the plan says to measure and the bench could; {} keeps the catalogue.

    A GPU the bench did not report on, or reported a figure for that is not a finite positive number, keeps its
    catalogue figure.
    """
    measure, why = plan(mode, simulated=probe.simulated)
    if not measure:
        (log.warning if mode == "on" else log.info)("GPU TFLOPS: %s", why)
        return {}
    log.info("GPU TFLOPS: %s", why)
    report = await bench.measure()
    if report.error:
        log.warning("GPU TFLOPS benchmark: %s; GPUs without a figure keep the catalogue's", report.error)
    measured = {normal_uuid(uuid): tflops for uuid, tflops in report.tflops.items()}
    figures: dict[int, float] = {}
    for index, uuid in enumerate(probe.uuids()):
        tflops = None if uuid is None else measured.get(normal_uuid(uuid))
        if tflops is None or not (math.isfinite(tflops) and tflops > 0):
            log.warning("GPU %d (%s): no usable measurement (%s); keeping the catalogue figure", index, uuid, tflops)
            continue
        figures[index] = round(tflops, 2)
    log.info("GPU TFLOPS measured: %s", figures)
    return figures


class SubprocessBench:
    """Runs this module in a child process (torch and CUDA contexts die with it) and reads its JSON report."""

    def __init__(
        self,
        python: str,
        *,
        size: int = DEFAULT_SIZE,
        dtype: MatmulDtype = "float32",
        seconds: float = DEFAULT_SECONDS,
        timeout_s: float = 120.0,
    ) -> None:
        self.argv = (python, "-m", BENCH_MODULE, "--size", str(size), "--dtype", dtype, "--seconds", repr(seconds))
        self.timeout_s = timeout_s

    async def measure(self) -> BenchReport:
        try:
            process = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            return BenchReport(error=f"cannot start the benchmark: {exc}")
        try:
            async with asyncio.timeout(self.timeout_s):  # not wait_for: on 3.11 it can swallow a cancellation
                stdout, stderr = await process.communicate()
        except TimeoutError:
            process.kill()
            await process.wait()
            return BenchReport(error=f"the benchmark did not finish within {self.timeout_s:.0f} s")
        if process.returncode != 0:
            tail = " | ".join(stderr.decode(errors="replace").strip().splitlines()[-3:])
            return BenchReport(error=f"the benchmark exited {process.returncode}: {tail}")
        return parse_report(stdout)


def parse_report(stdout: bytes) -> BenchReport:
    """The benchmark's last output line: ``{"devices": [{"uuid": ..., "tflops": ...}, ...], "error": ...}``."""
    lines = stdout.strip().splitlines()
    try:
        document = json.loads(lines[-1] if lines else b"")
        figures = {str(d["uuid"]): float(d["tflops"]) for d in document["devices"]}
        error = document.get("error")
    except (ValueError, KeyError, TypeError) as exc:
        return BenchReport(error=f"unreadable benchmark report ({exc}): {stdout[:200]!r}")
    return BenchReport(tflops=figures, error=None if error is None else str(error))


def _measure_all(size: int, dtype: MatmulDtype, seconds: float) -> dict[str, Any]:
    try:
        import torch
    except ImportError as exc:
        return {"devices": [], "error": f"torch is not installed ({exc})"}
    if not torch.cuda.is_available():
        return {"devices": [], "error": "torch.cuda is not available"}
    devices: list[dict[str, Any]] = []
    problems: list[str] = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        uuid = getattr(properties, "uuid", None)
        if uuid is None:
            problems.append(f"cuda:{index} has no UUID in this torch version")
            continue
        try:
            tflops = measure_matmul_tflops(f"cuda:{index}", size=size, dtype=dtype, seconds=seconds)
        except RuntimeError as exc:  # CUDA errors, out of memory
            problems.append(f"cuda:{index}: {exc}")
            continue
        devices.append({"index": index, "uuid": str(uuid), "name": properties.name, "tflops": tflops})
    return {"devices": devices, "error": "; ".join(problems) or None}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=BENCH_MODULE, description="Measure matmul TFLOPS on every CUDA device.")
    parser.add_argument("--size", type=int, default=DEFAULT_SIZE)
    parser.add_argument("--dtype", choices=["float32", "tf32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS)
    args = parser.parse_args(argv)
    print(json.dumps(_measure_all(args.size, args.dtype, args.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
