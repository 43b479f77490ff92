"""Training throughput under Shardyard against plain torchrun, and parameter-sync bandwidth (prints JSON).

``throughput``: the built-in runner (``python -m shardyard.training.shard``) trains the demo model on the demo
dataset, 2 ranks on CPU over gloo, the same workload in two ways:

- ``torchrun``: ``torchrun --standalone --nproc-per-node 2 -m shardyard.training.shard`` with the ``SHARDYARD_*``
  environment a node agent would give it (no progress channel, no lease: nothing reads them);
- ``shardyard``: the same job submitted to a local cluster (``shardyard.cli.cluster.up``: embedded broker, every
  service twice, 2 agents with 1 simulated A100 each), so each shard runs under its agent: lease watchdog, progress
  pipe, heartbeats, the control plane on the same cores.

Both are timed the same way, by the runner itself: each rank prints, when it finishes, the steps it trained after its
first one and how long they took (``... steps in ... s after the first: ... steps/s`` on stderr, which torchrun
passes through and the agent writes to the shard's log). That window leaves out process start, imports, loading,
the rendezvous and the first step, for both. A run's rate is its slowest rank's. The torchrun runs are made while the
cluster is up and idle, interleaved with the cluster's runs (``torchrun``, ``shardyard``, then the other way round),
so both see the same background; ``torchrun_quiet`` are extra torchrun runs before the cluster starts and after it
stopped (nothing else of ours running), for reference: the whole control plane (broker, two replicas of every
service, two agents: about a quarter of a core when idle) then shares the shards' cores in one case only, and other
work on the machine differs between the phases. ``ratio`` = median shardyard steps/s / median torchrun steps/s
(target >= 0.95); ``paired_ratios`` divide each job run by the torchrun run next to it (the two shared the machine's
state of the moment, which on a shared host swings by 20 % within seconds), ``paired_ratio_median`` is their median.

``bandwidth``: two gloo processes; for the demo model's parameters and for larger synthetic models, the runtime's
:class:`ParamSync.allreduce_mean` (the whole call: control slots, AllReduces, division by the world size) against a raw
``dist.all_reduce`` of one flat float32 tensor of the same byte count, called plainly and as ``async_op=True`` +
``wait()`` (the same call underneath; the faster median is the baseline). Each iteration times the three, each after
a barrier over as many calls back to back as make about 20 MiB (at most 50, so the skew of leaving the barrier does
not weigh), each first in turn (``--iterations`` times up to 8 MiB, a quarter of that above); every figure is wall
time per call. ``ratio`` = sync GB/s / raw GB/s of the medians (target >= 0.80); ``best_ratio`` the same of
the fastest iterations (what is left when the machine's other load does not interfere).

``probing`` (with ``--only probing`` only): what the agents' link probing costs a training job. The same 2-rank job on
a local cluster as in ``throughput``, on a fresh cluster for every run (probing is an agent start-up setting, given
through ``SHARDYARD_PROBE_LINKS`` and ``SHARDYARD_PROBE_INTERVAL_S``; the agents' rendezvous ranges, whose last port
is the probe endpoint, are a block ``up`` claims free on the host), with its agents probing
(``--probe-links true``, a round every ``--probe-interval-s``: 1 s by default against the agent's 5 s, so that rounds
run while the job trains) or not (``--probe-links false``), ``--runs`` of each, interleaved (on, off, then the other
way round). A run's ``links`` counts the measurements on the links topic, and those made while the gang was training
(``shared_with_sync``): what probing did beside the job, and ``agents_cpu_s_per_s`` the CPU the two agents used
(themselves, not their shards) a second from the job's submission to its end. ``probing_ratio`` = median steps/s
probing / median steps/s not (target >= 0.98); ``paired_ratios`` divide each probing run by the run next to it,
``paired_ratio_median`` is their median; ``probing_cpu_share_of_machine`` is the agents' median CPU a second probing
less not, over the machine's cores: what probing took from the job's cores, however noisy the rates are. Without
``--only``, ``throughput`` and ``bandwidth`` run, as before.

    python bench/training.py [--runs 5] [--steps 400] [--sync-interval 1] [--only throughput|bandwidth|probing]
        [--probe-interval-s 1] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from smoke import parse_args

RATE = re.compile(r"\[rank (\d+)/\d+\]: trained steps \d+\.\.\d+, (\d+) steps in ([0-9.]+) s after the first")
JOB_TIMEOUT_S = 600.0
SMOKE = {"runs": 1, "steps": 5, "batch_size": 2, "seq_len": 16, "iterations": 2, "sizes_mib": [1]}


# --- throughput ----------------------------------------------------------------------------------------------------
def _workload(args: argparse.Namespace) -> dict[str, Any]:
    return {"max_steps": args.steps, "batch_size": args.batch_size, "seq_len": args.seq_len, "lr": 3e-3, "seed": 0}


def _rate(log: str, what: str) -> dict[str, Any]:
    """The gang's steps/s from its ranks' summary lines: the slowest rank's."""
    ranks = {int(rank): (int(steps), float(seconds)) for rank, steps, seconds in RATE.findall(log)}
    if len(ranks) != 2:
        raise SystemExit(f"{what}: expected the summary line of 2 ranks, found {sorted(ranks)}; log:\n{log[-3000:]}")
    rates = {rank: steps / seconds for rank, (steps, seconds) in ranks.items()}
    return {"steps_per_s": min(rates.values()), "per_rank": [round(rates[r], 3) for r in sorted(rates)]}


def torchrun_run(data: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    from shardyard.training.artifacts import DEMO_DATASET, DEMO_MODEL
    from shardyard.training.config import (
        CHECKPOINT_EVERY_ENV,
        DEFAULT_CHECKPOINT_EVERY,
        DEFAULT_SLOW_SYNC_FACTOR,
        DEFAULT_SYNC_TIMEOUT_S,
        SLOW_SYNC_FACTOR_ENV,
        SYNC_TIMEOUT_ENV,
    )

    work = _workload(args)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "SHARDYARD_MODEL_DIR": str(data / DEMO_MODEL),
        "SHARDYARD_DATASET_DIR": str(data / DEMO_DATASET),
        "SHARDYARD_OUTPUT_DIR": str(out),
        "SHARDYARD_SYNC_INTERVAL": str(args.sync_interval),
        "SHARDYARD_MAX_STEPS": str(work["max_steps"]),
        "SHARDYARD_BATCH_SIZE": str(work["batch_size"]),
        "SHARDYARD_SEQ_LEN": str(work["seq_len"]),
        "SHARDYARD_LR": repr(work["lr"]),
        "SHARDYARD_SEED": str(work["seed"]),
        # What an agent with default settings gives its shards (node_agent.environment.RunnerOptions).
        CHECKPOINT_EVERY_ENV: str(DEFAULT_CHECKPOINT_EVERY),
        SYNC_TIMEOUT_ENV: repr(DEFAULT_SYNC_TIMEOUT_S),
        SLOW_SYNC_FACTOR_ENV: repr(DEFAULT_SLOW_SYNC_FACTOR),
    }
    env.pop("SHARDYARD_PROGRESS_FD", None)
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    argv = [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "shardyard.training.shard"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"torchrun exited {proc.returncode}:\n{log[-3000:]}")
    return _rate(log, "torchrun")


def shardyard_run(info: Any, index: int, args: argparse.Namespace) -> dict[str, Any]:
    from shardyard.cli import client
    from shardyard.cli.rundir import shard_log_dir

    example = json.loads((Path(__file__).parents[1] / "examples" / "fine_tune_gpt2.json").read_text())
    job_id = f"bench-{index}"
    document = {**example, "task_id": job_id, "sync_interval": args.sync_interval, "training": _workload(args)}
    client.submit(info.bootstrap, json.dumps(document).encode())
    final = client.wait(info.monitor_url, job_id, timeout_s=JOB_TIMEOUT_S, on_update=lambda _j: None)
    logs = sorted((shard_log_dir(Path(info.run_dir), job_id) / job_id).glob("shard-*.log"))
    log = "".join(p.read_text(errors="replace") for p in logs)
    if final["state"] != "SUCCEEDED":
        raise SystemExit(f"job {job_id} ended {final['state']}: {final.get('message')}\n{log[-3000:]}")
    return _rate(log, f"job {job_id}")


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    from shardyard.cli import cluster
    from shardyard.training.artifacts import create_demo_artifacts

    with tempfile.TemporaryDirectory(prefix="shardyard-bench-") as tmp:
        root = Path(tmp)
        data = root / "data"
        create_demo_artifacts(data)
        before = (args.runs + 1) // 2
        quiet = [torchrun_run(data, root / f"quiet-{i}", args) for i in range(before)]
        info = cluster.up(root / "run", nodes=["A100:1"] * 2, data_root=data, say=lambda _m: None)
        plain: list[dict[str, Any]] = []
        managed: list[dict[str, Any]] = []
        try:
            for i in range(args.runs):
                order: list[Callable[[], None]] = [
                    lambda i=i: plain.append(torchrun_run(data, root / f"torchrun-{i}", args)),
                    lambda i=i: managed.append(shardyard_run(info, i, args)),
                ]
                for run in order if i % 2 == 0 else order[::-1]:
                    run()
        finally:
            cluster.down(root / "run", say=lambda _m: None)
        quiet += [torchrun_run(data, root / f"quiet-{i}", args) for i in range(before, args.runs)]
    medians = {
        name: statistics.median(r["steps_per_s"] for r in runs)
        for name, runs in (("torchrun_quiet", quiet), ("torchrun", plain), ("shardyard", managed))
    }
    # Run i of each kind ran back to back, so they shared the machine's state of the moment.
    paired = [m["steps_per_s"] / p["steps_per_s"] for p, m in zip(plain, managed, strict=True)]
    return {
        "workload": {**_workload(args), "sync_interval": args.sync_interval, "ranks": 2, "device": "cpu/gloo"},
        "window": "per rank: end of its first step .. end of its last step; a run's rate is its slowest rank's",
        "runs": {"torchrun_quiet": quiet, "torchrun": plain, "shardyard": managed},
        "median_steps_per_s": {k: round(v, 3) for k, v in medians.items()},
        "ratio": round(medians["shardyard"] / medians["torchrun"], 4),
        "paired_ratios": [round(r, 4) for r in paired],
        "paired_ratio_median": round(statistics.median(paired), 4),
        "ratio_vs_quiet": round(medians["shardyard"] / medians["torchrun_quiet"], 4),
        "target": 0.95,
    }


# --- probing -------------------------------------------------------------------------------------------------------
PROBE_ENV = ("SHARDYARD_PROBE_LINKS", "SHARDYARD_PROBE_INTERVAL_S")


@contextlib.contextmanager
def _agent_env(values: dict[str, str]) -> Iterator[None]:
    """``values`` in the environment ``cluster.up`` hands its processes (settings: ``SHARDYARD_<FIELD>``)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def _links_measured(bootstrap: str) -> dict[str, int]:
    """The link measurements on the cluster's links topic up to now (the agents go on probing): all, and those made
    while a gang was training."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from shardyard.bus.topics import LINKS

    now_ms, deadline = time.time() * 1000, time.monotonic() + 15.0
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    counts = {"measurements": 0, "during_training": 0}
    try:
        reading = {TopicPartition(LINKS.name, p) for p in range(LINKS.partitions)}
        consumer.assign(list(reading))
        await consumer.seek_to_beginning(*reading)
        while reading and time.monotonic() < deadline:
            got = await consumer.getmany(*reading, timeout_ms=1500, max_records=10_000)
            if not got:
                break  # nothing more: every partition is read to its end
            for tp, records in got.items():
                for record in records:
                    if record.timestamp > now_ms:
                        reading.discard(tp)  # read up to now
                        break
                    counts["measurements"] += 1
                    counts["during_training"] += bool(json.loads(record.value or b"{}").get("shared_with_sync"))
    finally:
        await consumer.stop()
    return counts


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (its children not counted)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def probing_run(root: Path, data: Path, index: int, args: argparse.Namespace, *, probe: bool) -> dict[str, Any]:
    """One job on a cluster of its own, whose agents probe their links (every ``--probe-interval-s``) or not."""
    import asyncio

    from shardyard.cli import cluster

    knobs = {PROBE_ENV[0]: "true" if probe else "false", PROBE_ENV[1]: repr(args.probe_interval_s)}
    with _agent_env(knobs):
        info = cluster.up(root, nodes=["A100:1"] * 2, data_root=data, say=lambda _m: None)
    try:
        agents = [pid for name, pid in info.pids.items() if name.startswith("node-")]
        cpu_before, began = [_cpu_seconds(pid) for pid in agents], time.monotonic()
        result = shardyard_run(info, index, args)
        took = time.monotonic() - began
        used = sum(_cpu_seconds(pid) - before for pid, before in zip(agents, cpu_before, strict=True))
        result["agents_cpu_s_per_s"] = round(used / took, 4)  # the agents' own CPU (not their shards')
        result["links"] = asyncio.run(_links_measured(info.bootstrap))
    finally:
        cluster.down(root, say=lambda _m: None)
    return result


def probing(args: argparse.Namespace) -> dict[str, Any]:
    """The same job with the agents probing their links and without, interleaved (each on a fresh cluster: an
    agent's probing is a start-up setting)."""
    from shardyard.training.artifacts import create_demo_artifacts

    with tempfile.TemporaryDirectory(prefix="shardyard-bench-") as tmp:
        root = Path(tmp)
        data = root / "data"
        create_demo_artifacts(data)
        on: list[dict[str, Any]] = []
        off: list[dict[str, Any]] = []
        for i in range(args.runs):
            order: list[Callable[[], None]] = [
                lambda i=i: on.append(probing_run(root / f"on-{i}", data, 2 * i, args, probe=True)),
                lambda i=i: off.append(probing_run(root / f"off-{i}", data, 2 * i + 1, args, probe=False)),
            ]
            for run in order if i % 2 == 0 else order[::-1]:
                run()
            print(
                f"probing run {i}: on {on[-1]['steps_per_s']:.3f}, off {off[-1]['steps_per_s']:.3f} steps/s",
                file=sys.stderr,
            )
    medians = {name: statistics.median(r["steps_per_s"] for r in runs) for name, runs in (("on", on), ("off", off))}
    agents_cpu = {
        name: statistics.median(r["agents_cpu_s_per_s"] for r in runs) for name, runs in (("on", on), ("off", off))
    }
    # Run i of each kind ran back to back, so they shared the machine's state of the moment.
    paired = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(on, off, strict=True)]
    return {
        "workload": {**_workload(args), "sync_interval": args.sync_interval, "ranks": 2, "device": "cpu/gloo"},
        "window": "per rank: end of its first step .. end of its last step; a run's rate is its slowest rank's",
        "agents": {
            "probing_on": f"--probe-links true --probe-interval-s {args.probe_interval_s} (other probe settings:"
            " the agent's defaults)",
            "probing_off": "--probe-links false",
            "cluster": "a fresh local cluster per run (2 agents, 1 simulated A100 each), on then off, then the other"
            " way round",
        },
        "runs": {"probing_on": on, "probing_off": off},
        "median_steps_per_s": {f"probing_{k}": round(v, 3) for k, v in medians.items()},
        "probing_ratio": round(medians["on"] / medians["off"], 4),
        "paired_ratios": [round(r, 4) for r in paired],
        "paired_ratio_median": round(statistics.median(paired), 4),
        "agents_cpu_s_per_s": {f"probing_{k}": round(v, 4) for k, v in agents_cpu.items()},
        "probing_cpu_share_of_machine": round((agents_cpu["on"] - agents_cpu["off"]) / (os.cpu_count() or 1), 5),
        "target": 0.98,
    }


# --- bandwidth -----------------------------------------------------------------------------------------------------
def _synthetic(total_bytes: int) -> list[Any]:
    """Parameters shaped like a transformer's: 1 MiB matrices, each followed by a small bias."""
    import torch

    params = []
    while sum(p.numel() * 4 for p in params) < total_bytes:
        params += [torch.nn.Parameter(torch.randn(512, 512)), torch.nn.Parameter(torch.randn(512))]
    return params


def bandwidth_worker(rank: int, port: int, iterations: int, sizes_mib: list[int]) -> None:
    import torch
    import torch.distributed as dist

    from shardyard.training.artifacts import create_demo_artifacts
    from shardyard.training.model import load_pretrained
    from shardyard.training.sync import ParamSync

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    with tempfile.TemporaryDirectory(prefix="shardyard-bench-") as tmp:
        model = load_pretrained(create_demo_artifacts(Path(tmp)).model_dir)
    workloads = [("demo model", list(model.parameters()))]
    workloads += [(f"synthetic {mib} MiB", _synthetic(mib * 1024 * 1024)) for mib in sizes_mib]
    results = []
    for label, params in workloads:
        sync = ParamSync(params)
        flat = torch.zeros(sync.total_bytes // 4)
        raw_ms: list[float] = []
        raw_async_ms: list[float] = []
        sync_ms: list[float] = []

        # Each timing covers ``reps`` calls back to back after a barrier (as nccl-tests do): one call of a small
        # buffer takes about a millisecond, as long as the skew with which two ranks leave a barrier.
        reps = max(1, min(50, (20 * 1024 * 1024) // sync.total_bytes))

        def timed(call: Callable[[], object], out: list[float], reps: int = reps) -> None:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                call()
            out.append((time.perf_counter() - t0) * 1000.0 / reps)

        def raw(flat: torch.Tensor = flat, out: list[float] = raw_ms) -> None:
            timed(lambda: dist.all_reduce(flat), out)

        def raw_async(flat: torch.Tensor = flat, out: list[float] = raw_async_ms) -> None:
            timed(lambda: dist.all_reduce(flat, async_op=True).wait(), out)

        def synced(sync: ParamSync = sync, out: list[float] = sync_ms) -> None:
            timed(sync.allreduce_mean, out)

        runs = [raw, raw_async, synced]
        for _ in range(3):  # warm-up: connections, allocations
            for run in runs:
                run()
        for timings in (raw_ms, raw_async_ms, sync_ms):
            timings.clear()
        nbytes = sync.total_bytes
        count = iterations if nbytes <= 8 * 1024 * 1024 else max(10, iterations // 4)
        for i in range(count):
            for run in runs[i % 3 :] + runs[: i % 3]:  # each goes first, second and third in turn
                run()
        # The baseline is the faster of the two ways to call it (the same call underneath: the rest is noise).
        raw_med = min(statistics.median(raw_ms), statistics.median(raw_async_ms))
        raw_best = min(min(raw_ms), min(raw_async_ms))
        sync_med = statistics.median(sync_ms)
        results.append(
            {
                "params": label,
                "bytes": nbytes,
                "buckets": sync.num_buckets,
                "iterations": count,
                "calls_per_timing": reps,
                "raw_allreduce_ms": round(statistics.median(raw_ms), 4),
                "raw_async_allreduce_ms": round(statistics.median(raw_async_ms), 4),
                "param_sync_ms": round(sync_med, 4),
                "raw_gb_per_s": round(nbytes / raw_med / 1e6, 4),
                "param_sync_gb_per_s": round(nbytes / sync_med / 1e6, 4),
                "ratio": round(raw_med / sync_med, 4),
                "best_ratio": round(raw_best / min(sync_ms), 4),
            }
        )
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(results))


def bandwidth(args: argparse.Namespace) -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, __file__, "--port", str(port), "--iterations", str(args.iterations)]
    argv += ["--sizes-mib", *map(str, args.sizes_mib)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([*argv, "--worker", str(rank)], env=env, stdout=subprocess.PIPE, text=True) for rank in (0, 1)
    ]
    outputs = [proc.communicate(timeout=JOB_TIMEOUT_S)[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise SystemExit(f"bandwidth workers exited {[p.returncode for p in procs]}")
    results = json.loads(outputs[0].strip().splitlines()[-1])
    return {"backend": "gloo", "ranks": 2, "results": results, "target": 0.80}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs of each kind (throughput, probing)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--sync-interval", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=100, help="timed syncs per size (bandwidth)")
    parser.add_argument("--sizes-mib", type=int, nargs="*", default=[4, 64], help="synthetic models (bandwidth)")
    parser.add_argument("--probe-interval-s", type=float, default=1.0, help="agents' probe rounds (probing)")
    parser.add_argument("--only", choices=("throughput", "bandwidth", "probing"))
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parse_args(parser, SMOKE)
    if args.worker is not None:
        bandwidth_worker(args.worker, args.port, args.iterations, args.sizes_mib)
        return
    out: dict[str, Any] = {"bench": "training", "load_before": os.getloadavg()}
    if args.only == "probing":  # only when asked for: two clusters a run
        out["probing"] = probing(args)
    elif args.only != "bandwidth":
        out["throughput"] = throughput(args)
    if args.only not in ("throughput", "probing"):
        out["bandwidth"] = bandwidth(args)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
