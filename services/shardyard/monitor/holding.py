"""Who holds an elected service's leadership partition, as its group coordinator says (``monitor.leadership``)."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Member:
    member_id: str
    client_id: str
    host: str
    holds: bool
    """The group's assignment gives it the leadership partition."""


@dataclass(frozen=True)
class Holding:
    """Who holds a service's leadership partition, as the group coordinator said, since when (the monitor's clock)."""

    holder: Member | None
    members: tuple[Member, ...]
    since: datetime
    inherited: bool = False
    """Held already when this monitor first asked: when it began is unknown, so the newest sealed election that
    names its holder proves it, however old."""

    def then(self, members: Sequence[Member], now: datetime) -> "Holding":
        """This holding as the coordinator now says: the same holder keeps its ``since``."""
        holder = next((m for m in members if m.holds), None)
        same = (holder and holder.member_id) == (self.holder and self.holder.member_id)
        return Holding(holder, tuple(members), *((self.since, self.inherited) if same else (now, False)))


def observe(previous: Holding | None, members: Sequence[Member], now: datetime) -> Holding:
    """The holding after the coordinator's answer ``members`` at ``now``."""
    if previous is None:
        return Holding(next((m for m in members if m.holds), None), tuple(members), now, inherited=True)
    return previous.then(members, now)
