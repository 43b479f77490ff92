"""The queue's verdict on each recent submission, by where it was written (``topic/partition/offset``): what
``shardyard submit`` waits for, as ``sbatch`` waits for its job id (accepted) or its refusal (rejected, typed)."""

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

from shardyard.events import JobAccepted, JobRejected

KEPT: Final = 10_000
"""Verdicts kept (the newest): a client asks within seconds of its submission."""


@dataclass
class Verdicts:
    limit: int = KEPT
    _by_source: "OrderedDict[str, dict[str, Any]]" = field(default_factory=OrderedDict)

    def fold(self, event: object) -> None:
        if isinstance(event, JobAccepted):
            found: dict[str, Any] = {"outcome": "accepted", "job_id": event.job_id, "queue": event.spec.queue}
        elif isinstance(event, JobRejected):
            found = {
                "outcome": "rejected",
                "job_id": event.job_id,
                "reason": event.reason.value,
                "message": event.message,
            }
            found["errors"] = [error.model_dump(mode="json") for error in event.errors]
        else:
            return
        self._by_source[event.source_offset] = {"source": event.source_offset, **found}
        self._by_source.move_to_end(event.source_offset)
        while len(self._by_source) > self.limit:
            self._by_source.popitem(last=False)

    def of(self, source: str) -> dict[str, Any] | None:
        return self._by_source.get(source)
