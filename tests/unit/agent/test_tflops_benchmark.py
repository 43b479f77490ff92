from __future__ import annotations

import logging
import math
import sys
from collections.abc import Mapping

import pytest

from shardyard.events import GpuStatus
from shardyard.node_agent.benchmark import (
    BenchReport,
    MeasureMode,
    SubprocessBench,
    calibrate,
    measure_matmul_tflops,
    normal_uuid,
    parse_report,
    plan,
)
from shardyard.node_agent.inventory import MeasuredTflops, SimulatedGpus

GIB = 1024**3
UUIDS = ("GPU-8f3c0a11-0000-0000-0000-000000000001", "GPU-8f3c0a11-0000-0000-0000-000000000002")


class FakeNvml:
    """Two "real" A100s with NVML-style UUIDs."""

    simulated = False

    def uuids(self) -> tuple[str | None, ...]:
        return UUIDS

    def probe(self, utilization: Mapping[int, float]) -> tuple[GpuStatus, ...]:
        return tuple(GpuStatus(index=i, model="A100", tflops=35.0, memory_bytes=80 * GIB) for i in range(2))


class FakeBench:
    def __init__(self, report: BenchReport) -> None:
        self.report = report
        self.calls = 0

    async def measure(self) -> BenchReport:
        self.calls += 1
        return self.report


def test_measure_on_cpu_gives_a_finite_positive_figure() -> None:
    tflops = measure_matmul_tflops("cpu", size=32, dtype="float32", seconds=0.05)

    assert math.isfinite(tflops) and tflops > 0
    print(f"\nCPU matmul 32x32 float32: {tflops * 1000:.2f} GFLOPS")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"size": 0}, "size", id="size"),
        pytest.param({"seconds": 0.0}, "seconds", id="seconds"),
        pytest.param({"seconds": math.inf}, "seconds", id="infinite-seconds"),
    ],
)
def test_measure_refuses_bad_arguments(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        measure_matmul_tflops("cpu", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mode", "simulated", "measure"),
    [
        pytest.param("auto", False, True, id="auto-real"),
        pytest.param("auto", True, False, id="auto-simulated"),
        pytest.param("on", False, True, id="on-real"),
        pytest.param("on", True, False, id="on-simulated-keeps-the-catalogue"),
        pytest.param("off", False, False, id="off-real"),
        pytest.param("off", True, False, id="off-simulated"),
    ],
)
def test_plan(mode: MeasureMode, simulated: bool, measure: bool) -> None:
    assert plan(mode, simulated=simulated)[0] is measure


async def test_real_gpus_report_measured_figures() -> None:
    bench = FakeBench(BenchReport(tflops={"8F3C0A11-0000-0000-0000-000000000001": 18.44, UUIDS[1]: 19.01}))
    probe = MeasuredTflops(FakeNvml(), await calibrate("auto", FakeNvml(), bench))

    gpus = probe.probe({})

    assert [(g.tflops, g.tflops_source) for g in gpus] == [(18.44, "measured"), (19.01, "measured")]


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        pytest.param(
            BenchReport(tflops={UUIDS[0]: 18.0}), [(18.0, "measured"), (35.0, "catalogue")], id="one-gpu-unmeasured"
        ),
        pytest.param(
            BenchReport(tflops={UUIDS[0]: math.nan, UUIDS[1]: -1.0}),
            [(35.0, "catalogue"), (35.0, "catalogue")],
            id="unusable-figures",
        ),
        pytest.param(
            BenchReport(error="torch.cuda is not available"),
            [(35.0, "catalogue"), (35.0, "catalogue")],
            id="no-cuda",
        ),
    ],
)
async def test_gpus_without_a_usable_measurement_keep_the_catalogue(
    report: BenchReport, expected: list[tuple[float, str]]
) -> None:
    figures = await calibrate("on", FakeNvml(), FakeBench(report))

    assert [(g.tflops, g.tflops_source) for g in MeasuredTflops(FakeNvml(), figures).probe({})] == expected


async def test_on_with_simulated_gpus_keeps_the_catalogue_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    bench = FakeBench(BenchReport(tflops={"cpu": 0.05}))
    simulated = SimulatedGpus(["A100:2"])

    with caplog.at_level(logging.WARNING):
        figures = await calibrate("on", simulated, bench)

    assert figures == {} and bench.calls == 0
    assert [(g.tflops, g.tflops_source) for g in MeasuredTflops(simulated, figures).probe({})] == [
        (35.0, "catalogue"),
        (35.0, "catalogue"),
    ]
    assert "simulated" in caplog.text


async def test_off_never_measures() -> None:
    bench = FakeBench(BenchReport(tflops={UUIDS[0]: 18.0}))

    assert await calibrate("off", FakeNvml(), bench) == {} and bench.calls == 0


@pytest.mark.parametrize(
    ("stdout", "report"),
    [
        pytest.param(
            b'{"devices": [{"index": 0, "uuid": "abc", "name": "H100", "tflops": 51.5}], "error": null}',
            BenchReport(tflops={"abc": 51.5}),
            id="one-device",
        ),
        pytest.param(
            b'{"devices": [], "error": "torch.cuda is not available"}',
            BenchReport(error="torch.cuda is not available"),
            id="no-cuda",
        ),
        pytest.param(
            b'a warning on stdout\n{"devices": [{"uuid": "abc", "tflops": 51.5}], "error": null}\n',
            BenchReport(tflops={"abc": 51.5}),
            id="last-line-counts",
        ),
    ],
)
def test_parse_report(stdout: bytes, report: BenchReport) -> None:
    assert parse_report(stdout) == report


@pytest.mark.parametrize("stdout", [b"", b"not json", b'{"devices": [{"uuid": "x"}]}', b"[]"])
def test_unreadable_reports_are_errors(stdout: bytes) -> None:
    report = parse_report(stdout)

    assert report.tflops == {} and report.error is not None and "unreadable" in report.error


def test_uuids_compare_without_the_nvml_prefix() -> None:
    assert normal_uuid("GPU-8F3C-01") == normal_uuid("8f3c-01") == "8f3c-01"


async def test_the_benchmark_process_reports_no_cuda_on_a_cpu_machine() -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    report = await SubprocessBench(sys.executable, size=64, seconds=0.05, timeout_s=120).measure()

    assert report == BenchReport(error="torch.cuda is not available")


async def test_a_benchmark_that_cannot_start_is_an_error() -> None:
    report = await SubprocessBench("/nonexistent/python").measure()

    assert report.tflops == {} and report.error is not None and "cannot start" in report.error
