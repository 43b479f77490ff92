"""A straggler found in a running gang, and what the fault manager does about it (``shardyard.stragglers``)."""

from enum import StrEnum
from typing import Literal

from pydantic import Field

from shardyard.events.base import AwareDatetime, Event


class StragglerKind(StrEnum):
    """What makes a rank of a synchronous gang hold the others back."""

    SLOW_NODE = "SLOW_NODE"
    """Its own time in a step (its waits on the gang left out) is out of line, per sample too: its node is slow."""
    SLOW_LINK = "SLOW_LINK"
    """No rank's own time is out of line, but the gang waits on a slow measured link between two of its nodes."""
    IMBALANCED_JOB = "IMBALANCED_JOB"
    """The rank is slow per step, not per sample: its slice of the batch is larger; no node is to blame."""


class StragglerAction(StrEnum):
    """What the fault manager did about a straggler (``JobStraggling``)."""

    SWAP = "SWAP"
    """The gang is re-formed without it from the members' live state (a ``JobRecovering`` that spends no retry)."""
    NO_BETTER_PLACE = "NO_BETTER_PLACE"
    """No free GPU of the job's model on a node outside the gang that is not degraded: it trains on, slower."""
    SWAP_LIMIT = "SWAP_LIMIT"
    """The job was swapped as often as an hour allows."""
    NOT_A_NODE = "NOT_A_NODE"
    """A slow link or an imbalanced job: moving a shard elsewhere is not the remedy."""


class JobStraggling(Event):
    """The fault manager found a straggler in a running gang and says what it does about it. It moves no state: a
    swap follows as the ``JobRecovering`` (cause ``STRAGGLER``, no retry spent) it announces."""

    type: Literal["job.straggling"] = "job.straggling"
    job_id: str
    attempt: int
    kind: StragglerKind
    action: StragglerAction
    shard_index: int | None = Field(default=None, description="the slow rank; None for a slow link")
    node_id: str = Field(description="the slow rank's node, or one end of the slow link")
    peer_id: str | None = Field(default=None, description="the slow link's other end")
    ratio: float = Field(ge=0, description="how much slower than the rest of the gang")
    since: AwareDatetime = Field(description="when it began to hold the gang back")
    message: str = ""
