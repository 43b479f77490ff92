"""The queue's state and decisions: which jobs exist, in what state, and what a new submission becomes.

State is rebuilt from the lifecycle topic (``apply``); decisions (``on_submission``) return events to publish.
"""

from collections.abc import Mapping
from datetime import datetime

from shardyard.events import Event, JobAccepted, JobReady, JobRejected, RejectReason
from shardyard.lifecycle import JobState, LifecycleFact, can_move, target_state
from shardyard.queue.admission import Admitted, admit


class QueueBook:
    def __init__(self, catalogue: Mapping[str, float]) -> None:
        self.catalogue = catalogue
        self.states: dict[str, JobState] = {}
        self.sources: set[str] = set()

    def apply(self, event: LifecycleFact) -> None:
        """A fact from the lifecycle topic (including the queue's own earlier output)."""
        if isinstance(event, JobAccepted | JobRejected):
            self.sources.add(event.source_offset)
        target = target_state(event)
        if target is not None and can_move(self.states.get(event.job_id), target):
            self.states[event.job_id] = target

    def on_submission(self, raw: bytes, *, source: str, now: datetime) -> list[Event]:
        """Admit or refuse one submission. ``source`` (topic/partition/offset) makes redelivery a no-op."""
        if source in self.sources:
            return []
        fallback_id = "invalid-" + source.rsplit("/", 2)[-2] + "-" + source.rsplit("/", 1)[-1]
        result = admit(raw, catalogue=self.catalogue, submitted_at=now, fallback_id=fallback_id)
        events: list[Event]
        if isinstance(result, Admitted):
            current = self.states.get(result.spec.job_id)
            if current is not None and current is not JobState.REJECTED:
                events = [
                    JobRejected(
                        occurred_at=now,
                        job_id=result.spec.job_id,
                        reason=RejectReason.DUPLICATE_JOB,
                        message=f"a job named {result.spec.job_id!r} already exists (state {current}); "
                        "submit under a new task_id",
                        source_offset=source,
                    )
                ]
            else:
                events = [
                    JobAccepted(occurred_at=now, job_id=result.spec.job_id, spec=result.spec, source_offset=source),
                    JobReady(occurred_at=now, job_id=result.spec.job_id, spec=result.spec),
                ]
        else:
            events = [
                JobRejected(
                    occurred_at=now,
                    job_id=result.job_id,
                    reason=result.reason,
                    message=result.message,
                    errors=result.errors,
                    source_offset=source,
                )
            ]
        for event in events:
            if isinstance(event, JobAccepted | JobRejected | JobReady):
                self.apply(event)
        return events
