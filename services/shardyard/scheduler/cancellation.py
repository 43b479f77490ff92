"""Cancellation of the jobs the scheduler holds (pending, or placed: their shards are revoked). Pure: time comes in.

The queue cancels the jobs still waiting on parents; the scheduler cancels the rest. A request can reach the scheduler
before its job does (the queue released the job as the request was in flight), and a leader can take a request in
and lose its lease before carrying it out: ``CancelRequests`` keeps every request until its job ends, and each cycle
carries out those whose job is held here by then.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from shardyard.events import JobCancelled, JobCancelRequested, RevocationReason, ShardRevocation
from shardyard.scheduler.gang import Gang, revoke_unfinished


@dataclass
class CancelRequests:
    requested_by: dict[str, str] = field(default_factory=dict)
    """Job -> who asked to cancel it, for every job with a request and no end yet."""

    def note(self, request: JobCancelRequested) -> None:
        self.requested_by[request.job_id] = request.requested_by

    def forget(self, job_id: str) -> None:
        """The job ended (cancelled or not): its request is spent."""
        self.requested_by.pop(job_id, None)

    def due(self, held: Iterable[str], now: datetime) -> list[JobCancelRequested]:
        """The requests to carry out now: one for each job of ``held`` (the jobs held here) that has one."""
        return [
            JobCancelRequested(occurred_at=now, job_id=job_id, requested_by=self.requested_by[job_id])
            for job_id in held
            if job_id in self.requested_by
        ]


def cancellation(
    request: JobCancelRequested, gang: Gang | None, *, term: int, now: datetime
) -> tuple[list[ShardRevocation], JobCancelled]:
    """What cancels a held job: its placed shards revoked (none while it is pending), and its end."""
    message = f"cancelled by {request.requested_by}"
    revoked = revoke_unfinished(gang, RevocationReason.CANCELLED, message, term=term, now=now) if gang else []
    return revoked, JobCancelled(occurred_at=now, job_id=request.job_id, message=message)
