"""``shardyard submit``'s answer, as ``sbatch``'s: it waits for the queue's verdict on what it wrote (through the
monitor, which folds every ``job.accepted`` and ``job.rejected`` by the place of the submission they answer) and exits
0 only when the job was accepted; a rejection is printed with its typed reason and the way out, and exits 2 (as a
document refused before it was sent does); no verdict in time exits 1. ``--no-verdict`` returns once written.
With ``--wait`` it then follows the job: 0 once it SUCCEEDED, 1 when it ended otherwise, 3 once it has waited
``NEVER_FITS`` for ``--wait-timeout`` (it stays queued; the way out is printed)."""

import argparse
import json
import secrets
import sys
import time
from typing import Any, Final

from shardyard.cli import client
from shardyard.cli.cluster_info import ClusterInfo, get_json
from shardyard.errors import NeverFits

VERDICT_TIMEOUT_S: Final = 30.0
REFUSED: Final = 2
NO_VERDICT: Final = 1
NEVER_FITS_EXIT: Final = 3
"""``submit --wait``: the job waited ``NEVER_FITS`` for ``--wait-timeout`` (it stays queued)."""
WAIT_TIMEOUT_S: Final = 60.0


def add_options(submit: argparse.ArgumentParser) -> None:
    submit.add_argument("--no-verdict", action="store_true", help="return once written: do not wait for the verdict")
    submit.add_argument(
        "--verdict-timeout", type=float, default=VERDICT_TIMEOUT_S, help="seconds to wait for the queue's verdict"
    )
    submit.add_argument("--new-id", action="store_true", help="submit under a new id: the task_id and a random suffix")
    submit.add_argument(
        "--wait-timeout",
        type=float,
        default=WAIT_TIMEOUT_S,
        help="with --wait: stop waiting, exit 3, once no set of the cluster's nodes could hold the job (NEVER_FITS)"
        " for this many seconds; the job stays queued",
    )


def with_new_id(raw: bytes) -> bytes:
    """The document under a new id (its ``task_id`` and ``-`` six hex digits); other bytes as they are."""
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        return raw
    if not isinstance(document, dict) or not isinstance(document.get("task_id"), str):
        return raw
    return json.dumps({**document, "task_id": f"{document['task_id']}-{secrets.token_hex(3)}"}).encode()


def wait_verdict(monitor_url: str, source: str, timeout_s: float) -> dict[str, Any] | None:
    """The queue's verdict on the submission written at ``source``; None when none came within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    url = f"{monitor_url}/api/verdict?source={source}"
    while True:
        try:
            found: dict[str, Any] = get_json(url)
            return found
        except (OSError, ValueError):
            pass  # 404 until the queue answered and the monitor read it
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def way_out(found: dict[str, Any], existing: dict[str, Any] | None) -> str:
    """What to do about a rejection, by its reason."""
    job_id, reason = found["job_id"], found.get("reason")
    if reason == "DUPLICATE_JOB":
        state = f" ({existing['state']})" if existing else ""
        return (
            f"job {job_id} exists{state}: see `shardyard status {job_id}`; to run this document again, submit it with"
            " --new-id"
        )
    if reason == "UNAUTHENTICATED":
        return (
            "this cluster takes signed submissions: sign with `shardyard submit --credentials FILE` (a cluster `up`"
            " started signs with RUN_DIR/credentials.yaml by itself), or name the queue that takes unsigned ones"
            " (`up --anonymous-queue QUEUE`)"
        )
    if reason == "FORBIDDEN":
        return "the key is another team's than the queue's: sign with the key of the team whose queue the job names"
    return ""


def settle(info: ClusterInfo, submitted: client.Submitted, timeout_s: float) -> int | None:
    """Wait for the verdict and say it: None when the job was accepted, else the exit status."""
    from shardyard.bus.topics import SUBMISSIONS  # not at import: a listing loads none of the bus

    source = f"{SUBMISSIONS.name}/{submitted.partition}/{submitted.offset}"
    found = wait_verdict(info.monitor_url, source, timeout_s)
    if found is None:
        print(
            f"error: no verdict on {submitted.job_id} from the queue within {timeout_s:g} s (is the cluster up? "
            "`shardyard ps`); it may still be answered: `shardyard status` shows it",
            file=sys.stderr,
        )
        return NO_VERDICT
    if found["outcome"] == "accepted":
        print(f"accepted {found['job_id']} into queue {found.get('queue') or 'default'}")
        return None
    print(f"rejected {found['job_id']}: {found['reason']}: {found['message']}", file=sys.stderr)
    for error in found.get("errors") or []:
        print(f"  {error.get('field')}: {error.get('problem')}", file=sys.stderr)
    fix = way_out(found, client.job(info.monitor_url, found["job_id"]))
    if fix:
        print(fix, file=sys.stderr)
    return REFUSED


def follow(info: ClusterInfo, job_id: str, timeout_s: float, never_fits_s: float | None = None) -> dict[str, object]:
    """Follow the job on one line until it ends (or, with ``never_fits_s``, until it has waited ``NEVER_FITS`` that
    long: ``NeverFits``)."""
    from shardyard.cli.progress import ProgressLine

    line = ProgressLine()
    try:
        return client.wait(
            info.monitor_url, job_id, timeout_s=timeout_s, on_update=line.update, never_fits_s=never_fits_s
        )
    finally:
        line.close()


def gave_up(error: NeverFits, unschedulable_after: str = "the scheduler's unschedulable_after_s") -> int:
    """Say why ``submit --wait`` stopped following a job that cannot fit, and what to do; the exit status."""
    print(f"error: {error}", file=sys.stderr)
    print(
        f"it stays queued, and ends UNSCHEDULABLE after {unschedulable_after} unless nodes that could hold it join;"
        f" ask for fewer or other GPUs and submit again (--new-id), or cancel it: `shardyard cancel {error.job_id}`",
        file=sys.stderr,
    )
    return NEVER_FITS_EXIT
