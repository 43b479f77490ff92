"""The notes of a job's requeues in the monitor's view (``JobView``): preempted, recovered, resized, and the stragglers
the fault manager found (``JobStraggling``) with what it did about them."""

from datetime import datetime
from typing import Any

from shardyard.events import (
    FailureCause,
    JobPreempted,
    JobPreempting,
    JobRecovering,
    JobResized,
    JobStraggling,
    StragglerAction,
)

NOT_COUNTED = {FailureCause.STRAGGLER: "a straggler swapped out"}
"""What a recovery outside the retry budget was, by its cause (else a move off a full disk)."""
NOT_COUNTED_ELSE = "moved off a full disk"


class Requeues:
    """``JobView``'s notes of the gang stopping and starting again; the view holds the fields named here."""

    preempting: tuple[int, str] | None
    recoveries: int
    resizes: int
    stragglers: list[dict[str, Any]]

    def note(self, at: datetime, what: str, detail: str = "", *, attempt: int | None = None) -> None:
        raise NotImplementedError

    def pending(
        self,
        reason: str | None,
        message: str,
        *,
        node_counts: dict[str, int],
        waiting_for: list[str],
        missing: list[dict[str, Any]] | None = None,
    ) -> None:
        raise NotImplementedError

    def _preempting(self, event: JobPreempting) -> None:
        if self.preempting == (event.attempt, event.by_job):
            return  # redelivered: the preemption under way is noted once
        self.preempting = (event.attempt, event.by_job)
        self.note(
            event.occurred_at,
            "preempting",
            f"attempt {event.attempt} yields to {event.by_job}: checkpoint and stop within {event.deadline_s:g}s",
        )

    def _preempted(self, event: JobPreempted) -> None:
        self.preempting = None
        self.pending(None, f"preempted by {event.by_job}; requeued", node_counts={}, waiting_for=[])
        at_step = "" if event.checkpoint_step is None else f" at step {event.checkpoint_step}"  # a script's: unsaid
        kept = (
            f"checkpoint {event.checkpoint_dir}{at_step}"
            if event.checkpoint_dir
            else "no checkpoint: the next attempt starts over"
        )
        self.note(event.occurred_at, "preempted", f"attempt {event.attempt} stopped for {event.by_job}; {kept}")

    def _recovering(self, event: JobRecovering) -> None:
        self.recoveries += 1
        self.preempting = None
        avoided = (*event.exclude_nodes, *event.avoid_nodes)
        excluded = f"; avoiding {', '.join(avoided)}" if avoided else ""
        self.pending(None, f"recovering from {event.cause}{excluded}", node_counts={}, waiting_for=[])
        retry = (
            f"retry {event.retries_used}"
            if event.counted
            else f"{NOT_COUNTED.get(event.cause, NOT_COUNTED_ELSE)}, no retry used"
        )
        self.note(
            event.occurred_at,
            "recovering",
            f"attempt {event.attempt} failed ({event.cause}: {event.message}); {retry}, "
            f"{event.retries_left} left{excluded}",
        )

    def _resized(self, event: JobResized) -> None:
        self.resizes += 1
        self.pending(None, f"resizing: {event.reason}", node_counts={}, waiting_for=[])
        why = f"{event.reason} for {event.by_job}" if event.by_job else event.reason
        detail = f"attempt {event.attempt} re-forms at {event.to_shards} shards ({why}); no retry used"
        self.note(event.occurred_at, f"resized {event.from_shards} -> {event.to_shards}", detail)

    def _straggling(self, event: JobStraggling) -> None:
        """A straggler found: noted once per attempt and rank, and listed (the job page shows them)."""
        seen = {(s["attempt"], s["shard_index"], s["node_id"]) for s in self.stragglers}
        if (event.attempt, event.shard_index, event.node_id) in seen:
            return
        self.stragglers.append(event.model_dump(mode="json", include=STRAGGLER_FIELDS))
        what = "straggler swapped out" if event.action is StragglerAction.SWAP else "straggler"
        self.note(event.occurred_at, what, event.message, attempt=event.attempt)


STRAGGLER_FIELDS = {"occurred_at", "attempt", "kind", "action", "shard_index", "node_id", "peer_id", "ratio", "since"}
