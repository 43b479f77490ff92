"""A team cancels its own job through the queue: ``shardyard cancel JOB --credentials FILE`` writes
``{"cancel": JOB, "queue": QUEUE}`` to the submissions topic, keyed by the job, signed with the team's key as a
submission is (``shardyard.signing``). The queue replica deciding that job checks the signature (unsigned, badly
signed, expired or replayed: refused) and that the job, unfinished, is in the signing team's queue (else refused
``FORBIDDEN``), then publishes the cancel request itself, sealed as the queue's (``shardyard.bus.seal``), naming
the team. A refused cancel changes nothing and is logged with its reason. An operator cancels any job with the
cluster's own secret instead (``shardyard cancel`` without credentials)."""

import json
from datetime import datetime

from shardyard.events import JobCancelRequested, RejectReason, UsedSignature
from shardyard.queue.auth import Denied, Gate
from shardyard.signing import Signed

CANCEL_FIELD = "cancel"
MAX_CANCEL_BYTES = 4096


def cancel_target(raw: bytes) -> str | None:
    """The job a team's cancel document names; None when ``raw`` is not one (a submission, or anything else)."""
    if len(raw) > MAX_CANCEL_BYTES or b'"cancel"' not in raw:
        return None
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, dict) or set(document) - {CANCEL_FIELD, "queue"}:
        return None
    target = document.get(CANCEL_FIELD)
    return target if isinstance(target, str) and target else None


def decide(
    gate: Gate, signed: Signed | Denied | None, job_id: str, queue: str | None, *, event_id: str, now: datetime
) -> JobCancelRequested | Denied:
    """The cancel request to publish for a team's signed cancel of ``job_id`` (in ``queue``; None: no unfinished job
    of that id is known), or why it is refused."""
    if isinstance(signed, Denied):
        return signed
    if signed is None:
        return Denied(RejectReason.UNAUTHENTICATED, "a team's cancel must be signed with the team's key")
    if queue is None:
        return Denied(RejectReason.FORBIDDEN, f"no unfinished job {job_id!r} to cancel")
    denied = gate.admits(signed, queue)
    if denied is not None:
        return Denied(RejectReason.FORBIDDEN, f"team {signed.team} may not cancel {job_id!r} of queue {queue!r}")
    return JobCancelRequested(
        event_id=event_id,
        occurred_at=now,
        job_id=job_id,
        requested_by=f"team {signed.team}",
        signature=UsedSignature.of(signed),
    )
