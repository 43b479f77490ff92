"""The fault manager's answer to a straggler (``shardyard.stragglers``). Pure: time comes in.

Every replica runs the detector over every job's progress (the facts it follows); the replica that owns a job decides:

- **Swap** a slow node's rank (``SLOW_NODE``): announce it (``JobStraggling``, action ``SWAP``) and ask for the gang's
  re-formation without it, as a recovery that spends no retry (``JobRecovering``, cause ``STRAGGLER``, ``counted``
  False, the slow node avoided for the next attempt): the scheduler re-forms the gang from the members' live state
  (``reform``), so no step is lost. The node counts as **degraded** for ``degraded_s``: no swap goes to it, and the
  scheduler places on it last (``JobStraggling`` is its record).
- **Not swap**, and say why, when there is no better place (no node outside the gang, of the slow node's GPU model,
  ALIVE, not draining and not degraded, has a free GPU; the gang has no spare elsewhere: ``NO_BETTER_PLACE``), when
  the job was swapped ``swaps_per_hour`` times in the last hour (``SWAP_LIMIT``), or when the verdict blames a link
  or the job's split, not a node (``NOT_A_NODE``).

A verdict is decided once per attempt and rank: another replica's decision, followed, counts as taken.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from shardyard.events import (
    Event,
    FailureCause,
    JobCancelled,
    JobFailed,
    JobRecovering,
    JobStraggling,
    JobSucceeded,
    LinkMeasured,
    NodeState,
    NodeStatus,
    ShardCause,
    ShardProgress,
    StragglerAction,
    StragglerKind,
)
from shardyard.gpus import canonical_model
from shardyard.links import LinkTable, slow_links
from shardyard.stragglers.detector import Bounds, Detector, Straggler
from shardyard.stragglers.health import DEGRADED_S, note

SWAPS_PER_HOUR = 2


@dataclass(frozen=True)
class GangView:
    """What the watch needs of a job's current attempt (``FaultBook``'s gang)."""

    attempt: int
    shards: dict[int, str]
    spares: dict[int, str]
    retries_used: int
    retries_left: int


@dataclass
class StragglerWatch:
    bounds: Bounds = field(default_factory=Bounds)
    swaps_per_hour: int = SWAPS_PER_HOUR
    degraded_s: float = DEGRADED_S
    links: LinkTable = field(default_factory=LinkTable)
    nodes: dict[str, NodeState] = field(default_factory=dict)
    swaps: dict[str, dict[int, datetime]] = field(default_factory=dict)
    """Job -> the attempts swapped, and when (its ``JobStraggling`` SWAPs: applied once decided, and again when
    followed back)."""
    degraded: dict[str, datetime] = field(default_factory=dict)
    """Node -> until when it counts as degraded."""
    decided: set[tuple[str, int, int | None]] = field(default_factory=set)
    found: list[Straggler] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.detector = Detector(self.bounds, slow_links=self._slow_links)

    def apply(self, event: object) -> None:
        match event:
            case ShardProgress():
                verdict = self.detector.observe(event)
                if verdict is not None:
                    self.found.append(verdict)
            case LinkMeasured():
                self.links.apply(event)
            case NodeState():
                self.nodes[event.node_id] = event
            case JobStraggling():
                self.decided.add((event.job_id, event.attempt, event.shard_index))
                if event.action is StragglerAction.SWAP:
                    self.swaps.setdefault(event.job_id, {}).setdefault(event.attempt, event.occurred_at)
                note(self.degraded, event, self.degraded_s)
            case JobSucceeded() | JobFailed() | JobCancelled():
                self.detector.forget(event.job_id)
                self.swaps.pop(event.job_id, None)
            case _:
                pass

    def decide(self, gangs: dict[str, GangView], now: datetime) -> list[Event]:
        """What to do about each verdict found since the last call, for the jobs in ``gangs`` (those this replica
        owns, by their current attempt): each ``JobStraggling``, and a swap's ``JobRecovering`` after it. The caller
        applies them (``FaultBook.decide``)."""
        found, self.found = self.found, []
        out: list[Event] = []
        for verdict in found:
            gang = gangs.get(verdict.job_id)
            key = (verdict.job_id, verdict.attempt, verdict.shard_index)
            if gang is None or gang.attempt != verdict.attempt or key in self.decided:
                continue
            action = self._action(verdict, gang, now)
            said = self._said(verdict, action, now)
            self.decided.add(key)  # the book applies what is returned
            out.append(said)
            if action is StragglerAction.SWAP:
                out.append(self._swap(verdict, gang, now))
        return out

    def is_degraded(self, node_id: str, now: datetime) -> bool:
        until = self.degraded.get(node_id)
        return until is not None and until > now

    def _action(self, verdict: Straggler, gang: GangView, now: datetime) -> StragglerAction:
        if verdict.kind is not StragglerKind.SLOW_NODE:
            return StragglerAction.NOT_A_NODE
        recent = [at for at in self.swaps.get(verdict.job_id, {}).values() if (now - at).total_seconds() < 3600]
        if len(recent) >= self.swaps_per_hour:
            return StragglerAction.SWAP_LIMIT
        return (
            StragglerAction.SWAP if self._better_place(verdict.node_id, gang, now) else StragglerAction.NO_BETTER_PLACE
        )

    def _better_place(self, slow: str, gang: GangView, now: datetime) -> bool:
        """A spare of the gang on another node, or a free GPU of the slow node's model on a healthy node outside it."""
        if any(node != slow and not self.is_degraded(node, now) for node in gang.spares.values()):
            return True
        model = self._model(slow)
        taken = set(gang.shards.values()) | set(gang.spares.values())
        return any(
            state.status is NodeStatus.ALIVE
            and not state.draining
            and not self.is_degraded(node, now)
            and len(state.gpus) > len(state.allocated_gpus)
            and self._model(node) == model
            for node, state in self.nodes.items()
            if node not in taken
        )

    def _model(self, node_id: str) -> str | None:
        state = self.nodes.get(node_id)
        return canonical_model(state.gpus[0].model) if state is not None and state.gpus else None

    def _said(self, verdict: Straggler, action: StragglerAction, now: datetime) -> JobStraggling:
        then = {
            StragglerAction.SWAP: "swapping it out, from the gang's live state (no retry spent)",
            StragglerAction.NO_BETTER_PLACE: "no better place: no free GPU of its model on a healthy node elsewhere",
            StragglerAction.SWAP_LIMIT: f"not swapped: {self.swaps_per_hour} swaps in the last hour already",
            StragglerAction.NOT_A_NODE: "not swapped: no node is to blame",
        }[action]
        return JobStraggling(
            occurred_at=now,
            job_id=verdict.job_id,
            attempt=verdict.attempt,
            kind=verdict.kind,
            action=action,
            shard_index=verdict.shard_index,
            node_id=verdict.node_id,
            peer_id=verdict.peer_id,
            ratio=round(verdict.ratio, 3),
            since=verdict.since,
            message=f"straggler ({verdict.kind}): {verdict.detail}; {then}",
        )

    def _swap(self, verdict: Straggler, gang: GangView, now: datetime) -> JobRecovering:
        assert verdict.shard_index is not None
        cause = ShardCause(
            shard_index=verdict.shard_index,
            node_id=verdict.node_id,
            cause=FailureCause.STRAGGLER,
            message=verdict.detail,
        )
        return JobRecovering(
            occurred_at=now,
            job_id=verdict.job_id,
            attempt=verdict.attempt,
            cause=FailureCause.STRAGGLER,
            message=f"attempt {verdict.attempt}: rank {verdict.shard_index} straggles on {verdict.node_id}; "
            "re-formed without it (no retry spent)",
            causes=(cause,),
            avoid_nodes=(verdict.node_id,),
            retry_at=now,
            retries_used=gang.retries_used,
            retries_left=gang.retries_left,
            counted=False,
        )

    def _slow_links(self, nodes: set[str], at: datetime) -> Iterable[tuple[str, str, str]]:
        return [(s.link.a, s.link.b, s.why) for s in slow_links(list(self.links.links(at, among=nodes).values()))]
