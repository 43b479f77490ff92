"""``shardyard queues``: each team's queue as the monitor reads it (``/api/queues``): per GPU model its nominal
quota and the GPUs it uses, borrows and lends, its pending jobs, and its fair share."""

import argparse
import json
from collections.abc import Callable
from typing import Any, TypeAlias

from shardyard.cli import client, usage
from shardyard.text_table import table

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
COLUMNS = ["QUEUE", "MODEL", "NOMINAL", "USED", "BORROWED", "LENT", "PENDING GPUS", "PENDING JOBS", "SHARE"]
WIDE_COLUMNS = [*COLUMNS, "COHORT", "WEIGHT", "RUNNING JOBS", "STARVING SINCE"]


def render(answer: dict[str, Any], *, wide: bool = False) -> str:
    """One line per queue and model (a queue with no model at all: one line of dashes)."""
    rows = []
    for queue in answer["queues"]:
        models = queue["models"] or {"-": {}}
        for model, figures in models.items():
            line = [queue["queue"], model]
            line += [str(figures.get(kind, "-")) for kind in ("nominal", "used", "borrowed", "lent", "pending")]
            line += [str(queue["pending_jobs"]), f"{queue['fair_share']:.3f}"]
            if wide:
                weight = queue.get("weight")
                line += [queue.get("cohort") or "-", "-" if weight is None else f"{weight:g}"]
                line += [str(queue["running_jobs"]), queue.get("starving_since") or "-"]
            rows.append(line)
    head = (
        f"queues file {answer['source']} (version {str(answer['version'])[:12]}, min runtime "
        f"{answer['min_runtime_s']:g}s before reclaim)"
        if answer.get("configured")
        else "no queues file in force: one queue, no quotas"
    )
    return head + "\n" + table(rows, WIDE_COLUMNS if wide else COLUMNS)


def add_parser(sub: Commands, monitor_url: Callable[[argparse.Namespace], str]) -> None:
    def command(args: argparse.Namespace) -> int:
        answer = client.listing(monitor_url(args), "queues")
        print(json.dumps(answer, indent=2) if args.output == "json" else render(answer, wide=args.output == "wide"))
        return 0

    queues = sub.add_parser(
        "queues",
        help="each team's queue: quota, used, borrowed and lent GPUs per model, pending jobs, fair share",
        **usage.of("queues"),
    )
    queues.add_argument("-o", "--output", choices=("table", "wide", "json"), default="table")
    queues.set_defaults(func=command)
