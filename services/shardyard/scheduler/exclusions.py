"""Nodes a job is kept off after a failure there, for as long as the fault may last. Pure: time comes in.

A recovery plan excludes the nodes its failure struck (``JobRecovering.exclude_nodes``: a SUSPECT or LOST node, a
GPU fault, an OOM). Kept for good, one transient fault (a 2.7 s heartbeat gap on a loaded host) kept a job off an
ALIVE, idle node while it waited ``NO_FIT`` for minutes, and a job whose only fitting node was excluded waited for
ever. So an exclusion ends once its node has been ALIVE for ``heal_s`` without a break, counted from the exclusion or
from the node's return, whichever is later: a node that stays down stays excluded, one that failed again is excluded
again by the next plan. A job kept off nodes says which and until when (:meth:`Exclusions.describe`).
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from shardyard.events import NodeState, NodeStatus

DEFAULT_HEAL_S: Final = 120.0
"""How long an excluded node must stay ALIVE before the job may use it again: a flapping node fails within it."""


@dataclass
class Exclusions:
    heal_s: float = DEFAULT_HEAL_S
    by_job: dict[str, dict[str, datetime]] = field(default_factory=dict)
    """Job -> node -> when the node was excluded (the latest plan's time)."""
    alive_since: dict[str, datetime] = field(default_factory=dict)
    """Node -> since when it has been ALIVE without a break (absent: not ALIVE now)."""

    def add(self, job_id: str, nodes: tuple[str, ...] | frozenset[str], at: datetime) -> None:
        kept = self.by_job.setdefault(job_id, {})
        for node_id in nodes:
            kept[node_id] = max(at, kept.get(node_id, at))

    def node(self, state: NodeState) -> None:
        """A node's published state: its unbroken time ALIVE starts, goes on, or ends."""
        if state.status is not NodeStatus.ALIVE:
            self.alive_since.pop(state.node_id, None)
        elif state.node_id not in self.alive_since:
            self.alive_since[state.node_id] = state.occurred_at

    def ends(self, job_id: str, node_id: str) -> datetime | None:
        """When the job's exclusion from ``node_id`` ends if the node stays ALIVE; None while it is not ALIVE."""
        since = self.alive_since.get(node_id)
        excluded_at = self.by_job.get(job_id, {}).get(node_id)
        if since is None or excluded_at is None:
            return None
        return max(since, excluded_at) + timedelta(seconds=self.heal_s)

    def of(self, job_id: str, now: datetime) -> frozenset[str]:
        """The nodes ``job_id`` is kept off now; the exclusions that have healed are dropped."""
        kept = self.by_job.get(job_id)
        if not kept:
            return frozenset()
        for node_id in [n for n in kept if (end := self.ends(job_id, n)) is not None and end <= now]:
            del kept[node_id]
        return frozenset(kept)

    def describe(self, job_id: str, now: datetime) -> str:
        """Which nodes the job is kept off, and until when: for its pending reason."""
        parts = []
        for node_id in sorted(self.of(job_id, now)):
            end = self.ends(job_id, node_id)
            until = (
                f"until {end:%H:%M:%S} UTC if it stays ALIVE"
                if end is not None
                else f"until it has been ALIVE for {self.heal_s:g} s"
            )
            parts.append(f"{node_id} {until}")
        return "excluded after a failure: " + ", ".join(parts) if parts else ""

    def forget(self, job_id: str) -> None:
        self.by_job.pop(job_id, None)
