"""``shardyard simulate``: replay a trace under each policy and print their figures; or write a synthetic trace.

shardyard simulate TRACE.csv [--cluster A100:8x8,V100:8x8,H100:8x4] [--policy NAME ...] [--json]
                   [--policy-option KEY=VALUE ...] [--round-gpus] [--queues-file QUEUES.yaml] [--plot DIR]
                   [--checkpoint-s 10] [--checkpoint-every-s 1800] [--notice-s 30] [--notice-share 1]
                   [--restart-s 60] [--elastic-share 0.5] [--resize-s 5]
shardyard simulate --generate N [--shape default|philly|helios] [--seed S] [--load 0.95] [--cluster ...]
                   [--queues team-a:2,team-b:1] [--elastic-share 0.5] [--out trace.csv]

Preempted gangs lose work (docs/simulation.md): a notice of --notice-s, on which --notice-share of the jobs write a
checkpoint in --checkpoint-s; the others run on to the deadline and lose the work since their last periodic
checkpoint (every --checkpoint-every-s); each restart costs --restart-s. The report gives the GPU-hours lost to
preemption and the fleet's ETTR per policy.

Elastic jobs (a trace's min_shards and max_shards columns, or --elastic-share of its rigid jobs, picked by a hash of
the job id) start smaller when their preferred size does not fit, grow into GPUs no waiting job wants and give the
surplus back when one waits, under the shardyard policies; each resize holds the gang --resize-s without progress.
The report gives the resizes per policy beside the GPU utilisation.

The table ends with a verdict: by how much the shardyard policy cut (or raised) the mean JCT against each other
policy run, and their mean waits; it says so where shardyard did worse (--json: its "verdict" field).
--plot DIR also draws the replays into DIR (created if missing; needs matplotlib: pip install 'shardyard[plot]'):
jct_cdf.png and wait_cdf.png, the JCT and queueing delay CDFs per policy, and gpus_busy.png, the GPUs busy over
simulated time per policy against the cluster's total.

examples:
  shardyard simulate --generate 2000 --shape helios --load 0.9 --out t.csv && shardyard simulate t.csv --plot plots
  shardyard simulate --generate 500 --queues team-a:2,team-b:1 --out q.csv
  shardyard simulate q.csv --queues-file examples/queues.yaml --policy-option order=aging
"""

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardyard.errors import ConfigError
from shardyard.gpus import catalogue_with
from shardyard.sim.cluster import DEFAULT_CLUSTER, NodeSpec, describe, parse_cluster
from shardyard.sim.defaults import (
    DEFAULT_CHECKPOINT_EVERY_S,
    DEFAULT_CHECKPOINT_S,
    DEFAULT_NOTICE_S,
    DEFAULT_NOTICE_SHARE,
    DEFAULT_RESIZE_S,
    DEFAULT_RESTART_S,
    ONE_QUEUE,
    POLICY_NAMES,
)
from shardyard.sim.fit import fit_warnings
from shardyard.sim.generate import DEFAULT_LOAD, SHAPES, generate, mark_elastic, parse_queue_mix
from shardyard.sim.trace import TraceJob, read_trace, write_trace

if TYPE_CHECKING:
    from shardyard.quotas import QueuesConfig  # pydantic: loaded when a replay reads a queues file
    from shardyard.sim.lost_work import WorkModel
    from shardyard.sim.report import Summary

DESCRIPTION, _, _examples = (__doc__ or "").partition("\nexamples:\n")
EXAMPLES = "examples:\n" + _examples.rstrip()
"""The module's docstring in ``--help``: the synopsis as the description, its examples as the epilog."""

CORE_NOTE = (
    "shardyard = the real placement core (shardyard.placement.cycle.schedule, default Policy unless "
    "--policy-option); fifo = strict FIFO, no backfill; priority = priority order only, no reservation, aging or "
    "preemption; first-fit = priority, greedy, any GPU model; sjf-oracle = shortest true duration first (reference); "
    "shardyard-order = the core taking victims in its victim order, not by the work they lose; "
    "shardyard-one-queue = the core without the queues file's quotas (beside --queues-file)"
)


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    sim = subparsers.add_parser(
        "simulate",
        help="replay a job trace (CSV) in simulated time under Shardyard's placement core, FIFO and priority",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sim.add_argument("trace", nargs="?", help="the trace CSV (docs/simulation.md lists its columns)")
    sim.add_argument("--cluster", default=DEFAULT_CLUSTER, help=f"MODEL:GPUSxNODES groups (default {DEFAULT_CLUSTER})")
    sim.add_argument(
        "--policy",
        action="append",
        choices=POLICY_NAMES,
        help="a policy to run (repeat; default all: " + ", ".join(POLICY_NAMES) + ")",
    )
    sim.add_argument(
        "--policy-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the shardyard policy (repeat), e.g. order=aging, backfill=false, min_runtime_s=300,"
        " las_thresholds_gpu_s=3600,36000 (docs/architecture/placement.md lists them)",
    )
    sim.add_argument(
        "--round-gpus",
        action="store_true",
        help="round fractional GPU counts in the trace up to whole GPUs (default: refuse them, naming the line)",
    )
    sim.add_argument("--gpu-tflops", action="append", default=[], help="catalogue override MODEL=TFLOPS (repeat)")
    sim.add_argument(
        "--queues-file",
        help="the teams' queues (see examples/queues.yaml): the shardyard policy applies their quotas, borrowing, "
        "fair share and reclaim, and the report gives each queue's JCT, wait and share of its entitlement",
    )
    sim.add_argument(
        "--elastic-share",
        type=float,
        default=0.0,
        metavar="F",
        help="make this share (0..1) of the rigid jobs elastic, picked by a hash of the job id: min_shards = "
        "max(1, gpus // 2), max_shards = 2 x gpus at most the GPUs that can host it; with --generate, written into "
        "the trace (default 0)",
    )
    sim.add_argument("--json", action="store_true", help="print the figures as JSON")
    sim.add_argument(
        "--plot",
        metavar="DIR",
        help="also write PNG pictures into DIR (created if missing): jct_cdf.png, wait_cdf.png, gpus_busy.png; "
        "needs matplotlib (pip install 'shardyard[plot]')",
    )
    _work_options(sim)
    _audit_options(sim)
    _generation_options(sim)
    sim.set_defaults(func=run)


def _audit_options(sim: argparse.ArgumentParser) -> None:
    audit = sim.add_argument_group("start estimates (--json's start_estimates: the shardyard policy's, audited)")
    audit.add_argument(
        "--no-start-estimates", dest="start_estimates", action="store_false", help="skip the audit: faster"
    )
    audit.add_argument(
        "--start-estimates-oracle",
        action="store_true",
        help="make the audited estimates from every job's true run time (what the queue's model alone misses)",
    )


def _work_options(sim: argparse.ArgumentParser) -> None:
    work = sim.add_argument_group("lost work (how preempted gangs checkpoint, stop and restart)")
    options = (
        ("--checkpoint-s", DEFAULT_CHECKPOINT_S, "seconds a gang takes to write a checkpoint on a preemption notice"),
        (
            "--checkpoint-every-s",
            DEFAULT_CHECKPOINT_EVERY_S,
            "seconds of progress between a gang's periodic checkpoints (a trace's checkpoint_every_s column overrides"
            " it per job)",
        ),
        ("--notice-s", DEFAULT_NOTICE_S, "seconds from a preemption to the deadline at which a gang is stopped"),
        (
            "--notice-share",
            DEFAULT_NOTICE_SHARE,
            "share of the jobs (0..1, picked by a hash of the job id) that checkpoint on notice; the others lose "
            "the work since their last periodic checkpoint",
        ),
        ("--restart-s", DEFAULT_RESTART_S, "seconds each restart after a preemption holds its GPUs without progress"),
        ("--resize-s", DEFAULT_RESIZE_S, "seconds each resize of an elastic gang holds it without progress"),
    )
    for flag, default, text in options:
        work.add_argument(flag, type=float, default=default, help=f"{text} (default {default:g})")


def _generation_options(sim: argparse.ArgumentParser) -> None:
    gen = sim.add_argument_group("trace generation (writes a trace instead of simulating)")
    gen.add_argument("--generate", type=int, metavar="N", help="write a synthetic trace of N jobs for --cluster")
    gen.add_argument(
        "--shape",
        choices=SHAPES,
        default="default",
        help="the published cluster statistics the jobs follow (default: the built-in mix; see docs/simulation.md)",
    )
    gen.add_argument("--seed", type=int, default=0, help="random seed of --generate (default 0)")
    gen.add_argument(
        "--load", type=float, default=DEFAULT_LOAD, help=f"offered load of --generate (default {DEFAULT_LOAD})"
    )
    gen.add_argument(
        "--queues", metavar="QUEUE[:WEIGHT],...", help="spread the jobs over these queues, in proportion to the weights"
    )
    gen.add_argument("--out", default="-", help="where --generate writes (default - : standard output)")


def run(args: argparse.Namespace) -> int:
    try:
        catalogue = catalogue_with(args.gpu_tflops)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    nodes = parse_cluster(args.cluster, catalogue)
    if args.generate is not None:
        if args.trace is not None:
            raise ConfigError("give either a TRACE to simulate or --generate N, not both")
        if args.plot is not None:
            raise ConfigError("--plot draws a replay: give it with a TRACE, not with --generate")
        return _generate(args, nodes, catalogue)
    if args.trace is None:
        raise ConfigError("simulate needs a TRACE.csv (or --generate N to write one)")
    work = _work(args)
    plot_dir = None
    if args.plot is not None:
        from shardyard.sim import plots  # matplotlib: loaded only to draw

        plot_dir = plots.prepare(args.plot)  # before the replays: no matplotlib, no replay
    from shardyard.sim.engine import SimResult, simulate, to_us  # the engine and the policies: loaded to replay
    from shardyard.sim.fairness import Entitlements
    from shardyard.sim.policies import policy_named, policy_with
    from shardyard.sim.report import summarize
    from shardyard.sim.start_audit import StartAudit

    path = Path(args.trace)
    trace = _elastic(read_trace(path, catalogue, round_gpus=args.round_gpus), args.elastic_share, nodes)
    quotas = _queues(args.queues_file, trace)
    misfit = fit_warnings(trace, nodes) + ([] if quotas is None else _never_fit(quotas, trace))
    for warning in misfit:
        print(f"warning: {warning}", file=sys.stderr)
    core = policy_with(args.policy_option)
    names = list(dict.fromkeys(args.policy or (n for n in POLICY_NAMES if n != ONE_QUEUE or quotas is not None)))
    owed = None if quotas is None else Entitlements.of(quotas, nodes)

    audit = StartAudit(oracle=args.start_estimates_oracle) if args.json and args.start_estimates else None
    audit = audit if "shardyard" in names else None

    def replay(name: str) -> SimResult:
        chosen = policy_named(name, nodes, core, quotas, audit if name == "shardyard" else None)
        return simulate(trace, nodes, chosen, name=name, work=work, owed=owed)

    results = [replay(name) for name in names]
    drawn = [] if plot_dir is None else plots.write_plots(results, plot_dir)
    audited = None
    if audit is not None:
        ours = next(result for result in results if result.policy == "shardyard")
        audited = audit.report(
            {o.job.job_id: to_us(o.job.submit_s) for o in ours.outcomes},
            {o.job.job_id: o.first_start_us for o in ours.outcomes},
        )
    _report(args, trace, nodes, [summarize(result) for result in results], misfit, drawn, audited)
    return 0


def _report(
    args: argparse.Namespace,
    trace: Sequence[TraceJob],
    nodes: Sequence[NodeSpec],
    summaries: "Sequence[Summary]",
    misfit: list[str],
    drawn: Sequence[Path],
    start_estimates: dict[str, Any] | None = None,
) -> None:
    """The figures as JSON, or as the table (its verdict last) under the trace, cluster and pictures drawn."""
    from shardyard.sim.report import as_json, render_table, verdict

    if args.json:
        context = {
            "trace": str(Path(args.trace)),
            "jobs": len(trace),
            "cluster": args.cluster,
            "nodes": len(nodes),
            "gpus": sum(node.gpus for node in nodes),
            "checkpoint_s": args.checkpoint_s,
            "checkpoint_every_s": args.checkpoint_every_s,
            "notice_s": args.notice_s,
            "notice_share": args.notice_share,
            "restart_s": args.restart_s,
            "resize_s": args.resize_s,
            "elastic_share": args.elastic_share,
            "elastic_jobs": sum(job.min_shards is not None for job in trace),
            "queues_file": args.queues_file,
            "warnings": misfit,
            **({"plots": [str(path) for path in drawn]} if args.plot is not None else {}),
            **({"start_estimates": start_estimates} if start_estimates is not None else {}),
        }
        print(json.dumps(as_json(summaries, **context), indent=2))
        return
    span = max(job.submit_s for job in trace) - min(job.submit_s for job in trace)
    print(f"trace:    {Path(args.trace)} ({len(trace)} jobs submitted over {span:,.0f} s)")
    print(f"cluster:  {describe(nodes)}")
    print(
        f"work:     checkpoint every {args.checkpoint_every_s:g} s of progress; on preemption a {args.notice_s:g} s "
        f"notice, on which {args.notice_share:.0%} of the jobs checkpoint in {args.checkpoint_s:g} s (the others "
        f"lose the work since their last checkpoint); {args.restart_s:g} s per restart"
    )
    elastic = sum(job.min_shards is not None for job in trace)
    if elastic:
        print(f"elastic:  {elastic} jobs; each resize holds the gang {args.resize_s:g} s without progress")
    print(f"policies: {CORE_NOTE}")
    if drawn:
        print(f"plots:    {', '.join(str(path) for path in drawn)}")
    print()
    print(render_table(summaries))
    print()
    print(verdict(summaries))


def _work(args: argparse.Namespace) -> "WorkModel":
    from shardyard.sim.lost_work import WorkModel

    try:
        return WorkModel(
            checkpoint_s=args.checkpoint_s,
            checkpoint_every_s=args.checkpoint_every_s,
            notice_s=args.notice_s,
            notice_share=args.notice_share,
            restart_s=args.restart_s,
            resize_s=args.resize_s,
        )
    except ValueError as exc:
        name, _, problem = str(exc).partition(": ")
        raise ConfigError(f"--{name.replace('_', '-')} {problem}") from None


def _queues(path: str | None, trace: Sequence[TraceJob]) -> "QueuesConfig | None":
    """The queues file's configuration, once every queue the trace names is one of it (as admission requires)."""
    if path is None:
        return None
    from shardyard.queues_file import read_queues
    from shardyard.quotas import DEFAULT_QUEUE, QueuesFileError

    try:
        config, _version = read_queues(Path(path))
    except QueuesFileError as exc:
        raise ConfigError(f"--queues-file {path}: {exc}") from None
    unknown = sorted({job.queue or DEFAULT_QUEUE for job in trace} - set(config.queues))
    if unknown:
        raise ConfigError(f"the trace names queues {path} does not have (UNKNOWN_QUEUE): {', '.join(unknown)}")
    return config


def _never_fit(config: "QueuesConfig", trace: Sequence[TraceJob]) -> list[str]:
    """A warning naming the jobs admission would reject QUOTA_NEVER_FITS (they never start here), if any."""
    never = [
        job.job_id
        for job in trace
        if config.never_fits(job.queue or "default", job.gpus, job.gpu_model if job.min_match is None else None, 0, 0)
    ]
    if not never:
        return []
    named = ", ".join(never[:5]) + (f" and {len(never) - 5} more" if len(never) > 5 else "")
    return [f"queues: {len(never)} jobs ask for more than their queue could ever hold (QUOTA_NEVER_FITS): {named}"]


def _generate(args: argparse.Namespace, nodes: tuple[NodeSpec, ...], catalogue: Mapping[str, float]) -> int:
    try:
        mix = parse_queue_mix(args.queues) if args.queues else None
        jobs = generate(
            args.generate, args.seed, nodes, load=args.load, catalogue=catalogue, shape=args.shape, queues=mix
        )
        jobs = _elastic(jobs, args.elastic_share, nodes)
    except ValueError as exc:
        raise ConfigError(f"--generate: {exc}") from exc
    if args.out == "-":
        write_trace(jobs, sys.stdout)
        return 0
    out = Path(args.out)
    try:
        with out.open("w", newline="", encoding="utf-8") as stream:
            write_trace(jobs, stream)
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: {exc.strerror or exc}") from exc
    print(f"wrote {len(jobs)} jobs for {describe(nodes)} to {out} (seed {args.seed}, load {args.load:g})")
    return 0


def _elastic(jobs: list[TraceJob], share: float, nodes: Sequence[NodeSpec]) -> list[TraceJob]:
    """``jobs`` with ``share`` of the rigid ones made elastic (``generate.mark_elastic``)."""
    if share == 0:
        return jobs
    try:
        return mark_elastic(jobs, share, nodes)
    except ValueError as exc:
        raise ConfigError(f"--elastic-share {share:g}: {exc}") from None
