"""``shardyard simulate --plot DIR``: the replays as pictures, one PNG each, drawn with matplotlib's Agg canvas (no
display, no pyplot state). matplotlib is an optional extra (``pip install 'shardyard[plot]'``), imported inside
the functions that draw, so the rest of the simulator (and the CLI's parser) never loads it.

- ``jct_cdf.png``    per policy, the share of the trace's jobs completed within x seconds of their submission
- ``wait_cdf.png``   the same for the queueing delay (first start - submit)
- ``gpus_busy.png``  per policy, GPUs held by gangs (checkpointing included) over simulated time, against the
                     cluster's total

A CDF's y is a share of all the trace's jobs, so a policy that leaves jobs unfinished stays below 1. Its x is
logarithmic when the values span two decades or more (symmetric-log for waits, which are often 0).
"""

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from shardyard.errors import ConfigError
from shardyard.sim.engine import US, SimResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

JCT_CDF = "jct_cdf.png"
WAIT_CDF = "wait_cdf.png"
GPUS_BUSY = "gpus_busy.png"
WIDE = 100.0
"""Largest / smallest positive value from which a CDF's x axis is logarithmic."""
DPI = 120


def prepare(folder: str) -> Path:
    """``folder``, created if missing, once matplotlib is there to draw into it; ConfigError (one line) if not."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--plot needs matplotlib, which is not installed: pip install 'shardyard[plot]' (or pip install matplotlib)"
        ) from None
    out = Path(folder)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--plot {folder}: cannot create the folder: {exc.strerror or exc}") from exc
    return out


def write_plots(results: Sequence[SimResult], out: Path) -> list[Path]:
    """Draw the three pictures of ``results`` (one replay per policy, same trace and cluster) into ``out``."""
    written = [
        _save(_cdf(results, "jct"), out / JCT_CDF),
        _save(_cdf(results, "wait"), out / WAIT_CDF),
        _save(_busy(results), out / GPUS_BUSY),
    ]
    return written


def _values(result: SimResult, which: str) -> list[float]:
    """Each completed job's JCT (``which`` = "jct") or queueing delay, in seconds, ascending."""
    values = []
    for o in result.outcomes:
        if o.finish_us is not None and o.first_start_us is not None:
            end = o.finish_us if which == "jct" else o.first_start_us
            values.append(max(0.0, end / US - o.job.submit_s))
    return sorted(values)


def _cdf(results: Sequence[SimResult], which: str) -> "Figure":
    fig, ax = _figure()
    series = [(result, _values(result, which)) for result in results]
    for index, (result, values) in enumerate(series):
        jobs = len(result.outcomes) or 1
        shares = [(rank + 1) / jobs for rank in range(len(values))]
        mean = sum(values) / len(values) if values else 0.0
        label = f"{result.policy} (mean {mean:,.0f} s, {len(values)}/{len(result.outcomes)} done)"
        ax.step([0.0, *values], [0.0, *shares], where="post", color=f"C{index}", label=label)
    positive = [v for _result, values in series for v in values if v > 0]
    scale = "linear"
    if positive and max(positive) / min(positive) >= WIDE:
        scale = "log" if which == "jct" else "symlog"
        if scale == "log":
            ax.set_xscale("log")
            ax.set_xlim(left=min(positive) / 1.5)
        else:
            ax.set_xscale("symlog", linthresh=1.0)
            ax.set_xlim(left=0.0)
    what, span = (
        ("Job completion time", "submit to finish") if which == "jct" else ("Queueing delay", "submit to start")
    )
    unit = {"linear": "s", "log": "s, log scale", "symlog": "s, log scale above 1 s"}[scale]
    ax.set_title(f"{what} ({span}): CDF per policy")
    ax.set_xlabel(f"{what.lower()} ({unit})")
    ax.set_ylabel("share of the trace's jobs (0-1)")
    ax.set_ylim(0.0, 1.02)
    ax.legend(loc="lower right", fontsize="small")
    return fig


def _busy(results: Sequence[SimResult]) -> "Figure":
    from matplotlib.figure import Figure

    rows = max(1, len(results))
    fig = Figure(figsize=(10, 1.2 + 1.7 * rows), layout="constrained")
    axes = fig.subplots(rows, 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    start = min((o.job.submit_s for r in results for o in r.outcomes), default=0.0)
    end = max((t / US for r in results for t, _held in r.busy_gpus[-1:]), default=start) - start
    scale, unit = (3600.0, "h") if end > 3 * 3600 else (60.0, "min") if end > 3 * 60 else (1.0, "s")
    for index, (ax, result) in enumerate(zip(axes, results, strict=False)):
        times = [0.0, *((t / US - start) / scale for t, _held in result.busy_gpus)]
        held = [0, *(gpus for _t, gpus in result.busy_gpus)]
        span = times[-1] * scale
        util = result.busy_gpu_s / (result.total_gpus * span) if result.total_gpus and span > 0 else 0.0
        ax.step(times, held, where="post", color=f"C{index}", label=f"{result.policy} (GPU util {util:.1%})")
        ax.axhline(result.total_gpus, color="black", linestyle="--", linewidth=1, label=f"cluster: {result.total_gpus}")
        ax.set_ylim(0, result.total_gpus * 1.08 or 1)
        ax.set_ylabel("GPUs busy")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
    axes[-1].set_xlabel(f"simulated time since the first submission ({unit})")
    fig.suptitle("GPUs busy over time per policy (held by gangs, checkpointing included)")
    return fig


def _figure() -> "tuple[Figure, Axes]":
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 5.5), layout="constrained")
    ax = fig.add_subplot()
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax


def _save(fig: "Figure", path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)  # the Agg (raster, no display) canvas, whatever the default backend is
    try:
        fig.savefig(path, dpi=DPI)
    except OSError as exc:
        raise ConfigError(f"--plot: cannot write {path}: {exc.strerror or exc}") from exc
    return path
