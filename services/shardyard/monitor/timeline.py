"""A job's timeline as the monitor shows it: its notes in the order they happened, whatever order they arrived in.
Pure: notes in, a JSON-ready list out.

Notes come from two topics read by two consumers (the lifecycle, and the shards' events), so a shard's start often
arrives before the placement that caused it; and they carry the clocks of different hosts (the scheduler's, each
agent's). The timeline is therefore kept sorted, not appended to, by:

1. when it happened (``occurred_at``), except that a shard's fact never goes before the placement of its attempt:
   an agent whose clock is behind the scheduler's still started its shard after it was placed;
2. the attempt, so that one attempt's end comes before the next one's start at the same instant;
3. the lifecycle order of the kinds of notes (``ORDER``: scheduled before shard started before running ...), for
   notes of the same instant;
4. the order of arrival.

Each note shows its own ``occurred_at``: only the order is corrected, not the clocks.
"""

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, overload

MAX_NOTES = 500

ORDER: dict[str, int] = {
    name: rank
    for rank, names in enumerate(
        [
            ("accepted", "rejected", "resubmission refused"),
            ("waiting",),
            ("ready",),
            ("unschedulable",),
            ("stale placement fenced",),
            ("scheduled",),
            ("shard started",),
            ("running",),
            ("parameter sync",),
            ("preempting", "cancel requested"),
            ("shard completed", "shard failed"),
            ("preempted", "recovering"),
            ("succeeded", "failed", "cancelled"),
        ]
    )
    for name in names
}
"""The lifecycle order of the notes of one attempt, for notes of the same instant."""
SHARD_NOTES = frozenset({"shard started", "parameter sync", "shard completed", "shard failed"})
"""Notes of a shard's own facts, stamped by its agent's clock."""


@dataclass(frozen=True)
class _Note:
    at: datetime
    attempt: int
    rank: int
    arrival: int
    entry: dict[str, Any]


class Timeline(Sequence[dict[str, Any]]):
    """The notes (``{"at", "event", "detail"}``) in the order above; at most ``limit``, later ones are dropped."""

    def __init__(self, limit: int = MAX_NOTES) -> None:
        self.limit = limit
        self._notes: list[_Note] = []
        self._placed: dict[int, datetime] = {}
        """When each attempt was placed (its ``scheduled`` note)."""
        self._arrivals = 0

    def note(self, at: datetime, what: str, detail: str = "", *, attempt: int) -> None:
        """``what`` happened at ``at`` in ``attempt`` (the job's current one for notes that carry none)."""
        if len(self._notes) >= self.limit:
            return
        self._arrivals += 1
        note = _Note(at, attempt, ORDER.get(what, len(ORDER)), self._arrivals, {"at": at.isoformat(), "event": what})
        note.entry["detail"] = detail
        if what == "scheduled" and attempt not in self._placed:
            self._placed[attempt] = at
            self._notes.append(note)
            self._notes.sort(key=self._key)  # the attempt's shard notes that came first may move behind it
            return
        bisect.insort(self._notes, note, key=self._key)

    def _key(self, note: _Note) -> tuple[datetime, int, int, int]:
        at = note.at
        placed = self._placed.get(note.attempt)
        if placed is not None and note.entry["event"] in SHARD_NOTES and at < placed:
            at = placed
        return (at, note.attempt, note.rank, note.arrival)

    def entries(self) -> list[dict[str, Any]]:
        return [note.entry for note in self._notes]

    def __len__(self) -> int:
        return len(self._notes)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [note.entry for note in self._notes[index]]
        return self._notes[index].entry

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.entries())
