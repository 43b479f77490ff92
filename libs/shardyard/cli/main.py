"""``shardyard``: run a local cluster, submit jobs, and see what they are doing."""

import argparse
import contextlib
import getpass
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeAlias

from shardyard.cli import client, listing, render, show, usage, verdict
from shardyard.cli import history as history_cli
from shardyard.cli import logs as logs_cli
from shardyard.cli import ps as ps_cli
from shardyard.cli import queues as queues_cli
from shardyard.cli import token as token_cli
from shardyard.cli.cluster_info import ADMIN_PRINCIPAL, DEFAULT_NODES, REPLICAS, ClusterInfo
from shardyard.cli.rundir import DEFAULT_RUN_DIR, DEMO_RUN_DIR, remember, run_dir_of, start_dir_of
from shardyard.cli.team_files import broker_options, openness, sealed_env, secure_options, secured
from shardyard.errors import ClusterError, NeverFits, ShardyardError
from shardyard.sim import cli as sim_cli

EXAMPLE = Path(__file__).with_name("example_job.json")


def _info(args: argparse.Namespace, queue: str | None = None, run_dir: Path | None = None) -> ClusterInfo:
    """The running cluster; a command that publishes seals what it sends with the cluster's secret, if it has one,
    and speaks to a secured broker as the admin (an operator's command) or, for a job of ``queue``, as its team,
    unless the environment names another principal."""
    info = ClusterInfo.load(run_dir or run_dir_of(args)).live()
    principal = ADMIN_PRINCIPAL if queue is None else info.submitter(queue)
    for name, value in {**sealed_env(info.secret_file), **info.transport(principal)}.items():
        os.environ.setdefault(name, value)
    return info


def cmd_up(args: argparse.Namespace) -> int:
    from shardyard.cli import cluster  # starting processes: loaded by the commands that do only

    run_dir = start_dir_of(args)
    credentials, sealed = secured(args, run_dir)
    info = cluster.up(
        run_dir,
        nodes=args.node or DEFAULT_NODES,
        replicas=args.replicas,
        data_root=Path(args.data_root) if args.data_root else run_dir / "data",
        broker=args.broker,
        fresh=args.fresh,
        accounting_url=args.accounting_url or os.environ.get(history_cli.URL_ENV) or None,
        demo_data=args.demo_data,
        queues_file=Path(args.queues_file) if args.queues_file else None,
        credentials_file=credentials,
        sign_events=sealed,
        autoscale=cluster.Autoscale.of(args) if args.autoscale else None,
    )
    print(openness(info.secret_file, info.credentials_file))
    remember(run_dir)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from shardyard.cli import cluster

    cluster.down(run_dir_of(args))
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    raw = client.with_owner(verdict.with_new_id(raw) if args.new_id else raw, _user())  # else nobody says who asked
    refused = None if args.no_check else client.check(raw)
    if refused is not None:
        print(render.refusal(refused), file=sys.stderr)
        return 2
    info = _info(args, queue=client.queue_of(raw))
    credentials = args.credentials or os.environ.get(client.CREDENTIALS_ENV) or info.credentials_file
    raw, signed = client.sealed_submission(raw, credentials) if credentials else (raw, [])
    submitted = client.submit(info.bootstrap, raw, signed)
    print(f"submitted {submitted.job_id} (partition {submitted.partition}, offset {submitted.offset})")
    failed = None if args.no_verdict else verdict.settle(info, submitted, args.verdict_timeout)
    if failed is not None or not args.wait:
        return failed or 0
    try:
        final = verdict.follow(info, submitted.job_id, args.timeout, never_fits_s=args.wait_timeout)
    except NeverFits as never:
        return verdict.gave_up(never)
    detail = client.job(info.monitor_url, submitted.job_id) or final
    print(render.job_detail(detail, datetime.now(UTC)))
    return 0 if final["state"] == "SUCCEEDED" else 1


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name in this environment (a bare container)
        return None


def _requester() -> str:
    user = _user()
    return f"cli:{user}" if user else "cli"


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def cmd_cancel(args: argparse.Namespace) -> int:
    info = _info(args)
    found = client.job(info.monitor_url, args.job)
    if found is None:
        return _fail(f"no job {args.job!r} (see `shardyard jobs`)")
    if found["state"] in client.TERMINAL_STATES:
        return _fail(f"job {args.job!r} already ended {found['state']}; there is nothing to cancel")
    credentials = args.credentials or os.environ.get(client.CREDENTIALS_ENV)
    if credentials:  # a team's cancel of its own job, signed with the team's key, through the queue
        client.request_team_cancel(info.bootstrap, args.job, str(found.get("queue") or "default"), credentials)
    else:  # the operator's, sealed with the cluster's secret where it has one
        client.request_cancel(info.bootstrap, args.job, requested_by=_requester())
    print(f"cancel requested for {args.job} (state {found['state']})")
    if not args.wait:
        return 0
    final = client.wait(info.monitor_url, args.job, timeout_s=args.timeout, on_update=lambda _job: None)
    if final["state"] != "CANCELLED":
        return _fail(f"job {args.job!r} ended {final['state']} before the cancellation took effect")
    print(f"job {args.job} cancelled: {final.get('message') or ''}")
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    info = _info(args)
    if client.node(info.monitor_url, args.node) is None:
        return _fail(f"no node {args.node!r} has reported (see `shardyard nodes`)")
    draining = not args.undo
    client.request_drain(info.bootstrap, args.node, draining=draining)
    if draining:
        print(f"draining {args.node}: it takes no new shards; shards running there finish")
    else:
        print(f"undraining {args.node}: it takes new shards again")
    if args.wait:
        client.wait_node(info.monitor_url, args.node, draining=draining, timeout_s=args.timeout)
        print(f"node {args.node} is {'draining' if draining else 'no longer draining'}")
    return 0


def _top_frame(monitor_url: str) -> str:
    nodes = client.listing(monitor_url, "nodes")["nodes"]
    jobs = client.listing(monitor_url, "jobs")["jobs"]
    firing = client.listing(monitor_url, "alerts")["firing"]
    return render.top(nodes, jobs, firing, datetime.now(UTC))


def cmd_top(args: argparse.Namespace) -> int:
    info = _info(args)
    if args.once:
        print(_top_frame(info.monitor_url))
        return 0
    tty = sys.stdout.isatty()
    while True:
        try:
            frame = _top_frame(info.monitor_url)
        except ClusterError as exc:  # a monitor replica went away: say so, try the others next second
            frame = f"shardyard top: {exc}"
            info = info.live()
        # On a terminal the frame redraws in place; in a log, frames follow each other.
        sys.stdout.write(("\x1b[H\x1b[2J" if tty else "\n") + frame + "\n")
        sys.stdout.flush()
        time.sleep(args.interval)


def cmd_demo(args: argparse.Namespace) -> int:
    from shardyard.broker.choice import choose
    from shardyard.cli import cluster
    from shardyard.training.artifacts import create_demo_artifacts

    run_dir = start_dir_of(args, DEMO_RUN_DIR)
    data_root = run_dir / "data"
    began = time.monotonic()
    print(f"creating the demo's pretrained checkpoint and dataset under {data_root}")
    create_demo_artifacts(data_root)
    credentials, sealed = secured(args, run_dir)
    # Each demo starts afresh: its folder's local broker log emptied (a kept one holds the last demo's job, and the
    # example again would be a DUPLICATE_JOB); on an outside broker, whose log is not ours, the example takes a new id.
    local = choose(args.broker, os.environ).kind != "external"
    info = cluster.up(
        run_dir, data_root=data_root, broker=args.broker, credentials_file=credentials, sign_events=sealed, fresh=local
    )
    try:
        raw = client.with_owner(EXAMPLE.read_bytes() if local else verdict.with_new_id(EXAMPLE.read_bytes()), _user())
        print(f"submitting the example job (S15):\n{EXAMPLE.read_text().strip()}")
        raw, signed = client.sealed_submission(raw, str(credentials)) if credentials else (raw, [])
        _info(args, client.queue_of(raw), run_dir)  # submitted as its queue's team, as `shardyard submit` does
        submitted = client.submit(info.bootstrap, raw, signed)
        refused = verdict.settle(info, submitted, verdict.VERDICT_TIMEOUT_S)
        if refused is not None:
            return refused
        final = verdict.follow(info, submitted.job_id, args.timeout)
        detail = client.job(info.monitor_url, submitted.job_id) or final
        print(render.job_detail(detail, datetime.now(UTC)))
        print("timeline:")
        print(render.timeline(detail))
        print("loss:")
        print(render.loss_curve(detail))
        print(listing.nodes_table(client.listing(info.monitor_url, "nodes")["nodes"], datetime.now(UTC)))
    finally:
        if not args.keep:
            cluster.down(run_dir)
        else:
            remember(run_dir)  # the commands that follow read the demo's cluster
    print(f"demo finished in {time.monotonic() - began:.1f}s: {final['state']}")
    return 0 if final["state"] == "SUCCEEDED" else 1


Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="shardyard", description=__doc__)
    top.add_argument("--run-dir", help=f"the local cluster's folder (env SHARDYARD_RUN_DIR; default {DEFAULT_RUN_DIR})")
    sub = top.add_subparsers(dest="command", required=True)
    # In the order `shardyard --help` lists them.
    _cluster_commands(sub)
    ps_cli.add_parser(sub, run_dir_of)
    _job_commands(sub)
    _node_commands(sub)
    _view_commands(sub)
    queues_cli.add_parser(sub, lambda args: _info(args).monitor_url)
    token_cli.add_parser(sub)
    history_cli.add_parser(sub, run_dir_of)
    logs_cli.add_parser(sub, _info)
    sim_cli.add_parser(sub)
    _demo_command(sub)
    for command in sub.choices.values():  # `shardyard up --run-dir X` as well as `shardyard --run-dir X up`
        command.add_argument("--run-dir", dest="sub_run_dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return top


def _replicas(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 8:
        raise argparse.ArgumentTypeError(f"a number of processes per service, 1 to 8: {value!r}")
    return int(value)


def _cluster_commands(sub: Commands) -> None:
    up = sub.add_parser("up", help="start a local cluster (its own Apache Kafka by default)", **usage.of("up"))
    up.add_argument("--node", action="append", help="a node's simulated GPUs, e.g. A100:2 (repeat per node)")
    up.add_argument("--data-root", help="local folder the agents mount at /data (default RUN_DIR/data)")
    up.add_argument("--demo-data", action="store_true", help="first make the example job's model and dataset there")
    up.add_argument(
        "--replicas",
        type=_replicas,
        default=REPLICAS,
        help=f"processes per service (default {REPLICAS}; 1: no failover, a lighter cluster)",
    )
    up.add_argument(
        "--accounting-url",
        help="the job accounting database: sqlite:///PATH or postgresql://... (env SHARDYARD_ACCOUNTING_URL; "
        "default RUN_DIR/accounting.db)",
    )
    up.add_argument(
        "--queues-file", help="the teams' queues and quotas (YAML, see examples/queues.yaml), read again on change"
    )
    up.add_argument(
        "--credentials-file",
        help="the teams' keys: the queue takes only signed submissions (docs/security/submissions.md)",
    )
    broker_options(up, fresh=True)
    secure_options(up)
    up.add_argument(
        "--sign-events",
        action="store_true",
        help="with --insecure: every process still seals its events under a new cluster secret "
        "(RUN_DIR/cluster.secret) and refuses the unsealed (docs/security)",
    )
    _autoscale_options(up)
    up.set_defaults(func=cmd_up)

    sub.add_parser("down", help="stop the local cluster", **usage.of("down")).set_defaults(func=cmd_down)


def _autoscale_options(up: argparse.ArgumentParser) -> None:
    up.add_argument(
        "--autoscale",
        action="store_true",
        help="also start an autoscaler that adds node agents for waiting jobs and removes idle ones "
        "(docs/operators/autoscaling.md)",
    )
    up.add_argument("--autoscale-gpus", action="append", help="an added node's GPUs, e.g. A100:2 (repeat per model)")
    up.add_argument("--autoscale-max-nodes", type=int, default=2, help="most nodes it adds (default 2)")
    up.add_argument("--autoscale-min-nodes", type=int, default=0, help="it never removes below this many (default 0)")
    up.add_argument("--autoscale-cooldown-s", type=float, default=60.0, help="seconds between scale actions")
    up.add_argument("--autoscale-min-lifetime-s", type=float, help="an added node stays this long at least")
    up.add_argument("--autoscale-idle-s", type=float, help="idle seconds before a node may be removed (default 300)")


def _job_commands(sub: Commands) -> None:
    submit = sub.add_parser("submit", help="produce a job's JSON to the submission topic", **usage.of("submit"))
    submit.add_argument("file", help="the job's JSON file, or - for standard input")
    submit.add_argument("--wait", action="store_true", help="follow the job until it ends")
    submit.add_argument("--timeout", type=float, default=3600.0, help="seconds --wait waits at most")
    submit.add_argument(
        "--no-check",
        action="store_true",
        help="produce it even when the queue's admission rules reject the document (to see the cluster's answer)",
    )
    submit.add_argument(
        "--credentials", help="sign it with its queue's team key from this file (env SHARDYARD_CREDENTIALS)"
    )
    verdict.add_options(submit)
    submit.set_defaults(func=cmd_submit)

    show.add_status(sub)

    cancel = sub.add_parser("cancel", help="ask the cluster to cancel a job that has not ended", **usage.of("cancel"))
    cancel.add_argument("job")
    cancel.add_argument("--wait", action="store_true", help="wait until the monitor shows the job CANCELLED")
    cancel.add_argument(
        "--credentials", help="cancel as the job's team, signed with its key from this file (env SHARDYARD_CREDENTIALS)"
    )
    cancel.add_argument("--timeout", type=float, default=120.0, help="seconds --wait waits at most")
    cancel.set_defaults(func=cmd_cancel)


def _node_commands(sub: Commands) -> None:
    drain = sub.add_parser(
        "drain", help="stop placing new shards on a node (running ones finish), or --undo it", **usage.of("drain")
    )
    drain.add_argument("node")
    drain.add_argument("--undo", action="store_true", help="let the node take new shards again")
    drain.add_argument("--wait", action="store_true", help="wait until the monitor shows the node's new mark")
    drain.add_argument("--timeout", type=float, default=60.0, help="seconds --wait waits at most")
    drain.set_defaults(func=cmd_drain)


def _view_commands(sub: Commands) -> None:
    show.add_listings(sub)

    top = sub.add_parser(
        "top", help="a live view of nodes, jobs and alerts firing, redrawn every second", **usage.of("top")
    )
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
    top.set_defaults(func=cmd_top)


def _demo_command(sub: Commands) -> None:
    demo = sub.add_parser(
        "demo", help="create demo data, start a cluster, run the S15 example, stop the cluster", **usage.of("demo")
    )
    demo.add_argument("--timeout", type=float, default=600.0)
    demo.add_argument(
        "--keep", action="store_true", help="leave the cluster running afterwards (the one the next commands read)"
    )
    broker_options(demo)
    secure_options(demo)
    demo.set_defaults(func=cmd_demo)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except ShardyardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``shardyard status | head``): say nothing more, as cat or ls would.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
