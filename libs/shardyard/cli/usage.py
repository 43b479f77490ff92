"""What each subcommand's ``--help`` says beyond its options: a description, and a few examples under
``examples:`` (as ``kubectl`` and ``ray job`` print them). ``sub.add_parser(name, help=..., **usage.of(name))``;
a command without an entry here fails when the parser is built, and ``tests/unit/cli/test_cli_help.py`` holds every
subcommand to a description and an ``examples:`` epilog."""

import argparse
from typing import Any

USAGE: dict[str, tuple[str, tuple[str, ...]]] = {
    "up": (
        "Start a local cluster: its broker (a local Apache Kafka, its log in RUN_DIR/kafka, kept by down for the\n"
        "next up; the embedded broker where no Java 17+ runs; an outside one with SHARDYARD_KAFKA_BOOTSTRAP), N\n"
        "processes of every service and one node agent per --node, each a separate process, with a supervisor that\n"
        "restarts what dies. Logs, cluster.json and the accounting database go to the run folder (--run-dir, else\n"
        "./.shardyard; one cluster per folder). Clusters side by side on one host each claim rendezvous ports of\n"
        "their own. It is secured:\n"
        "events are sealed, and only submissions signed with its keys (RUN_DIR/credentials.yaml; submit uses them)\n"
        "are taken.",
        (
            "shardyard up --node A100:2 --node V100:2 --replicas 1 --demo-data   # with the example's data",
            "shardyard up --anonymous-queue default   # unsigned JSON (kcat) into the default queue too",
            "shardyard up --fresh                      # forget the jobs of earlier runs from this folder",
        ),
    ),
    "down": (
        "Stop the local cluster: the supervisor first, then the agents (so their shards stop), then the services\n"
        "and the broker.",
        ("shardyard down", "shardyard down --run-dir /tmp/other-cluster"),
    ),
    "ps": (
        "Every process `shardyard up` started and its supervisor keeps running: replica, pid, state, uptime,\n"
        "restarts (how often the supervisor started it again after it died) and its metrics port.",
        ("shardyard ps", "shardyard ps -o json"),
    ),
    "submit": (
        "Produce a job's JSON (examples/fine_tune_gpt2.json shows the format) to shardyard.jobs.submissions. The\n"
        "document is first checked with the queue's own admission code; a bad one is refused with the rejection\n"
        "the queue would give. A document that names no owner gets the local user name.",
        (
            "shardyard submit examples/fine_tune_gpt2.json --wait",
            "cat job.json | shardyard submit -",
            "shardyard submit bad.json --no-check     # see the cluster's own rejection",
        ),
    ),
    "status": (
        "Without a job: the cluster at a glance (as sinfo): nodes by status, GPUs in use and free per model, jobs\n"
        "by state, alerts firing, the scheduler's leader and the monitor's URL.\n"
        "With a job: its state, reason, shards and timeline. The job listing is `shardyard jobs`.",
        ("shardyard status", "shardyard status fine_tune_gpt2", "shardyard status -o json | jq .gpu_models"),
    ),
    "cancel": (
        "Ask the cluster to cancel a job that has not ended: its shards are stopped and it ends CANCELLED.",
        ("shardyard cancel fine_tune_gpt2", "shardyard cancel fine_tune_gpt2 --wait --timeout 60"),
    ),
    "drain": (
        "Stop placing new shards on a node; shards running there finish. --undo lets it take new ones again.",
        ("shardyard drain node-2 --wait", "shardyard drain node-2 --undo"),
    ),
    "jobs": (
        "Every job the monitor knows (as squeue): state, owner, queue, priority, GPUs, step, loss, elapsed time\n"
        "(since it started running; while pending, since it was submitted) and the reason it waits or ended.",
        ("shardyard jobs", "shardyard jobs -o wide", "shardyard jobs -o json | jq '.jobs[].state'"),
    ),
    "nodes": (
        "Every node that has reported: status, drain mark, GPUs, GPUs in use, CPU load and the shards it runs.\n"
        "--links shows the measured links instead: an RTT matrix of the live nodes, slow links marked.",
        ("shardyard nodes", "shardyard nodes -o wide", "shardyard nodes --links -o wide"),
    ),
    "alerts": (
        "The alerts firing now, longest-firing first, and the recent transitions (FIRING, RESOLVED), newest first.",
        ("shardyard alerts", "shardyard alerts -o wide", "shardyard alerts -o json"),
    ),
    "queues": (
        "Each team's queue (the queues file in force, see examples/queues.yaml): per GPU model its nominal quota and\n"
        "the GPUs its running jobs use, borrow from its cohort and lend to it; its pending jobs and GPUs; its fair\n"
        "share (the weighted dominant share of the cluster it holds: the queue with the lowest goes first).",
        ("shardyard queues", "shardyard queues -o wide", "shardyard queues -o json"),
    ),
    "token": (
        "A team's read token for the monitor's API, from its newest key not revoked in a credentials file. With it\n"
        "(SHARDYARD_MONITOR_TOKEN) the CLI and the dashboard read every job, but other teams' entrypoints hidden.",
        ("shardyard token --credentials team-a.yaml", "shardyard token --credentials keys.yaml --team team-a"),
    ),
    "top": (
        "A live view, redrawn every second: nodes (GPUs, utilisation, load, temperature, status), jobs (state, step,\n"
        "loss) and the alerts firing. Ctrl-C ends it.",
        ("shardyard top", "shardyard top --once", "shardyard top --interval 5"),
    ),
    "history": (
        "Every job the accounting service recorded, newest submission first, read from the database itself (it\n"
        "answers after `shardyard down`): times, wait, run time, GPU-hours, attempts, ETTR (the share of its time\n"
        "spent on productive training; -o wide adds where the rest went), result, final loss.",
        (
            "shardyard history --since 1d --state FAILED -o wide",
            "shardyard history --job fine_tune_gpt2 -o json",
            "shardyard history --since 7d -o csv > jobs.csv",
        ),
    ),
    "logs": (
        "A job's shard logs, each shard's newest attempt unless --attempt, read from the agents' log folder (this\n"
        "cluster run's, under RUN_DIR/logs/shards/RUN_ID; or --log-dir); with several shards each line says whose\n"
        "it is.",
        (
            "shardyard logs fine_tune_gpt2 --follow",
            "shardyard logs fine_tune_gpt2 --shard 1 --attempt 1",
        ),
    ),
    "demo": (
        "Create a small pretrained checkpoint and dataset under RUN_DIR/data, start a cluster of its own (RUN_DIR:\n"
        "--run-dir, else ./.shardyard-demo, never the folder of a cluster you started), submit the example job\n"
        "(S15), wait for it, print its timeline and loss curve, and stop the cluster.",
        ("shardyard demo", "shardyard demo --keep      # leave the cluster running"),
    ),
}


def of(command: str) -> dict[str, Any]:
    """``add_parser``'s keywords for ``command``: its description, its examples as the epilog, printed as written."""
    description, examples = USAGE[command]
    return {
        "description": description,
        "epilog": "examples:\n" + "\n".join(f"  {example}" for example in examples),
        "formatter_class": argparse.RawDescriptionHelpFormatter,
    }
