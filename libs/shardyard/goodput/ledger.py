"""A job's goodput ledger: where the time from its submission to its end (or to now) went, split into parts that do
not overlap and add up to the whole, and its effective-training-time ratio (ETTR): productive time over the whole.

The parts (each defined precisely in :mod:`shardyard.goodput.fold`, which computes them):

- ``queued``: waiting for GPUs: from submission to the first placement, and after a preemption until the next one;
- ``productive``: running on a full-match placement, taking steps the job had not taken before;
- ``recovery``: starting and restarting: from a placement until the gang's first step, from a fault (the gang's last
  step before it) until the gang is placed again, and the wait for that placement;
- ``recomputed``: taking again steps the job had already taken (lost with a fault, since the last checkpoint);
- ``notice``: from a preemption notice (``job.preempting``) until the gang stopped (``job.preempted``);
- ``degraded``: what would be productive, on a degraded placement (slower GPUs than the job asked for);
- ``straggler``: time lost to a slow member of the gang (not measured yet: always 0).
"""

from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class Part(StrEnum):
    QUEUED = "queued"
    PRODUCTIVE = "productive"
    RECOVERY = "recovery"
    RECOMPUTED = "recomputed"
    NOTICE = "notice"
    DEGRADED = "degraded"
    STRAGGLER = "straggler"


PARTS: Final = tuple(Part)
"""The parts in the order every reader shows them."""


@dataclass(frozen=True)
class Ledger:
    """Seconds per part; ``total_s`` is their sum, which is the job's time from submission to its end (or to the
    ``now`` the ledger was taken at)."""

    queued_s: float = 0.0
    productive_s: float = 0.0
    recovery_s: float = 0.0
    recomputed_s: float = 0.0
    notice_s: float = 0.0
    degraded_s: float = 0.0
    straggler_s: float = 0.0

    @property
    def total_s(self) -> float:
        return sum(self.seconds(part) for part in PARTS)

    @property
    def ettr(self) -> float | None:
        """Productive time over the whole, 0 to 1; None while the whole is 0 (a job accepted this instant)."""
        total = self.total_s
        return self.productive_s / total if total > 0 else None

    def seconds(self, part: Part) -> float:
        value: float = getattr(self, f"{part.value}_s")
        return value

    def to_json(self) -> dict[str, float | None]:
        """``{"queued_s": ..., ..., "total_s": ..., "ettr": ...}``, to the microsecond: the shape of the status API,
        and the names of the accounting columns (``shardyard.jobdb.record``, all but ``total_s``)."""
        return {
            **{f"{part.value}_s": round(self.seconds(part), 6) for part in PARTS},
            "total_s": round(self.total_s, 6),
            "ettr": None if self.ettr is None else round(self.ettr, 6),
        }


def ledger_of(seconds: dict[Part, float]) -> Ledger:
    """A ledger of seconds per part (parts left out: 0)."""
    return Ledger(**{f"{part.value}_s": seconds.get(part, 0.0) for part in PARTS})
