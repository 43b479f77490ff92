"""The placement filters as one table: what a node must pass to take shards of a job, each with its name (the key of
a "why not" count), the typed reason it gives and its check. Placing and explaining both read it: the index files
nodes by the state filters, a candidate keeps the groups that pass the group filters, a walk skips the buckets and
nodes that fail the bucket and node filters, and ``contention.explain`` counts every node under the first filter it
fails, in table order. A filter added here is applied and explained alike. Pure.

Each filter is decided at the coarsest level its check allows; that keeps a decision's cost flat at any cluster size:

- state: the node alone. The index files a node that fails one outside its buckets, tallied per group, so no walk
  meets it and explain counts it without looking at it;
- group: a (GPU model, TFLOPS) group, once per job (``Candidate.eligible``);
- bucket: the free-GPU count that all nodes of a bucket share, once per bucket;
- node: one node, for the nodes a walk meets and the usable nodes explain counts;
- gang: the gang as a whole, over the nodes that pass every other filter.

The levels come in that order (state and group filters interleaved), as the index applies them. The filters up to the
last group one ask whether a node is one the job could use at all (``IDENTITY``); those after, whether it can take
the job's shards now (``CAPACITY``). Resource filters (free GPUs, memory, CPU) are also what a node's capacity is
made of, and what freeing GPUs cures.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from typing import Final, Protocol

from shardyard.events import JobSpec, NodeStatus, PendingReason
from shardyard.gpus import match_score
from shardyard.placement.model import NodeView, Policy


class Node(Protocol):
    """A node as the filters read it: its slot in the cycle's index (``index.Slot``)."""

    view: NodeView
    node_id: str
    load: float
    reserved_for: str | None
    memory: int
    cpu: float
    artifacts: Mapping[str, str]
    ports: list[int]


class Kind(Protocol):
    """A group of nodes of one GPU model and TFLOPS figure (``index.Group``)."""

    model: str
    tflops: float


class Wants(Protocol):
    """A pending job as the filters read it (``candidate.Candidate``)."""

    spec: JobSpec
    k: int
    memory_per_shard: int
    cpu_per_shard: float
    degraded: bool
    excluded: frozenset[str]
    model_path: str
    dataset_path: str
    quota_models: frozenset[str] | None
    """The GPU models its queue has quota for now (``placement.quota``); None: the cluster has no queues file."""


class Match(StrEnum):
    """Which placements of a job a group filter applies to."""

    FULL = "full"
    """The job's own GPU model and TFLOPS."""
    DEGRADED = "degraded"
    """A lower match, down to the job's ``min_match``: once it has waited ``max_wait_s``, if it opted in."""
    ANY = "any"
    """Every placement, full or degraded."""


@dataclass(frozen=True, eq=False)
class Filter:
    """One row of the table; each level's subclass adds the check, on what that level decides on."""

    name: str
    """The key of the filter's "why not" count; the load filter's names the policy's threshold (see ``label``)."""
    reason: PendingReason
    """The job's pending reason when this filter is what leaves too few GPUs."""

    def label(self, policy: Policy) -> str:
        return self.name.format(policy=policy)


@dataclass(frozen=True, eq=False)
class StateFilter(Filter):
    check: Callable[[Node, Policy], bool]


@dataclass(frozen=True, eq=False)
class GroupFilter(Filter):
    check: Callable[[Kind, Wants], bool]
    match: Match
    """The placements it applies to: a degraded job is held to the degraded filters instead of the full ones."""


@dataclass(frozen=True, eq=False)
class BucketFilter(Filter):
    check: Callable[[int], bool]
    """Reads only the free-GPU count, which every node of a bucket shares (and no job: walks cache the counts that
    pass)."""
    resource: bool = False


@dataclass(frozen=True, eq=False)
class NodeFilter(Filter):
    check: Callable[[Node, Wants], bool]
    resource: bool = False


@dataclass(frozen=True, eq=False)
class GangFilter(Filter):
    check: Callable[[Sequence[tuple[Node, int]], Wants], bool]
    """Over the gang's candidate nodes, each with the shards it can take."""


def memory_shards(memory: float, job: Wants) -> float:
    """Shards of ``job`` whose memory fits in ``memory`` bytes (no bound when a shard needs none)."""
    per_shard = job.memory_per_shard
    return memory // per_shard if per_shard else math.inf


def cpu_shards(cpu: float, job: Wants) -> float:
    """Shards of ``job`` whose cores fit in ``cpu`` (no bound when a shard needs none)."""
    per_shard = job.cpu_per_shard
    # The 1e-9: cores left after shards of a third of a core each fall a hair short of a whole number.
    return int(cpu / per_shard + 1e-9) if per_shard else math.inf


def shards(gpus: int, memory: float, cpu: float, job: Wants) -> int:
    """Shards of ``job`` that ``gpus`` free GPUs with ``memory`` bytes and ``cpu`` cores can take: as many as the
    scarcest of the three allows. A node passes the resource filters exactly when this is at least one."""
    return int(min(gpus, memory_shards(memory, job), cpu_shards(cpu, job)))


def _model_named(group: Kind, job: Wants) -> bool:
    wanted = job.spec.gpu_model
    return wanted is None or group.model == wanted


def _match_above_floor(group: Kind, job: Wants) -> bool:
    spec = job.spec
    floor = spec.min_match if spec.min_match is not None else 1.0
    return match_score(group.tflops, spec.min_tflops) >= floor - 1e-9


def _within_quota(group: Kind, job: Wants) -> bool:
    allowed = job.quota_models
    return allowed is None or group.model in allowed


def _has_artifacts(node: Node, job: Wants) -> bool:
    artifacts = node.artifacts
    return job.model_path in artifacts and job.dataset_path in artifacts


def absent_artifacts(node: Node, job: Wants) -> list[str]:
    """The job's paths (model, dataset; normalised) that ``node`` lacks: why it fails the artifact filter (empty: it
    passes it). The filter itself checks inline: it runs for every node a walk meets."""
    artifacts = node.artifacts
    return [path for path in dict.fromkeys((job.model_path, job.dataset_path)) if path not in artifacts]


def _disk_has_room(node: Node, policy: Policy) -> bool:
    free = node.view.disk_free_bytes
    return free is None or free >= policy.disk_floor_bytes


def _holds_the_gang(members: Sequence[tuple[Node, int]], job: Wants) -> bool:
    return sum(count for _node, count in members) >= job.k


def _can_coordinate(members: Sequence[tuple[Node, int]], job: Wants) -> bool:
    return any(node.ports for node, _count in members)


NOT_ALIVE: Final = "node not alive"
DRAINING: Final = "node draining"
MODEL: Final = "GPU model mismatch"
TFLOPS: Final = "TFLOPS below minimum"
MATCH: Final = "match below min_match"
QUOTA: Final = "over its queue's quota"
LOAD: Final = "load above {policy.load_threshold:.0%}"
DISK: Final = "output disk below {policy.disk_floor} free"
RESERVED: Final = "reserved for a higher-priority job"
NO_GPU: Final = "no free GPU"
EXCLUDED: Final = "excluded after a failure"
MEMORY: Final = "insufficient memory"
CPU: Final = "insufficient CPU"
ARTIFACT: Final = "model or dataset absent"
TOO_FEW: Final = "fewer free GPUs than shards"
NO_PORT: Final = "no free rendezvous port"

FILTERS: Final = (
    # Suspect or lost: its heartbeats stopped, so nothing new is sent there.
    StateFilter(NOT_ALIVE, PendingReason.NO_FIT, lambda node, policy: node.view.status is NodeStatus.ALIVE),
    # Its operator is emptying it: what runs there finishes, nothing new starts.
    StateFilter(DRAINING, PendingReason.NO_FIT, lambda node, policy: not node.view.draining),
    # The GPU model the job names, by canonical name; any model when it names none.
    GroupFilter(MODEL, PendingReason.GPU_MODEL_MISMATCH, _model_named, Match.FULL),
    GroupFilter(
        TFLOPS, PendingReason.INSUFFICIENT_TFLOPS, lambda group, job: group.tflops >= job.spec.min_tflops, Match.FULL
    ),
    # In place of the two above once a job that opted in has waited long enough: TFLOPS down to its floor.
    GroupFilter(MATCH, PendingReason.GPU_MODEL_MISMATCH, _match_above_floor, Match.DEGRADED),
    # A GPU model the job's queue has no quota left for (its nominal, and what its cohort lends now): the job waits
    # for its queue's jobs to end or for quota to come idle (``placement.quota``). Last of the group filters: a node
    # of the kind the job asks for, held back by quota, says so rather than that it is the wrong kind.
    GroupFilter(QUOTA, PendingReason.QUOTA_EXCEEDED, _within_quota, Match.ANY),
    # S16: a node at or above the load threshold takes no new shards (the job waits for the load to drop).
    StateFilter(LOAD, PendingReason.LOAD_TOO_HIGH, lambda node, policy: node.load < policy.load_threshold),
    # Its output disk (checkpoints, the final model) has less room than the floor: a shard would fail DISK_FULL
    # there, so the job goes to a disk with room or waits for one. A node that reports no disk is not judged.
    StateFilter(DISK, PendingReason.DISK_FULL, _disk_has_room),
    # Held this cycle for a blocked higher-priority job (``ClusterIndex.reserve``): lower jobs backfill elsewhere.
    StateFilter(RESERVED, PendingReason.RESERVED_FOR_HIGHER_PRIORITY, lambda node, policy: node.reserved_for is None),
    BucketFilter(NO_GPU, PendingReason.INSUFFICIENT_GPUS, lambda free: free > 0, resource=True),
    # Where this job's shards failed before: a requeued job avoids the nodes that lost it.
    NodeFilter(EXCLUDED, PendingReason.NO_FIT, lambda node, job: node.node_id not in job.excluded),
    NodeFilter(
        MEMORY,
        PendingReason.INSUFFICIENT_MEMORY,
        lambda node, job: memory_shards(node.memory, job) >= 1,
        resource=True,
    ),
    NodeFilter(CPU, PendingReason.INSUFFICIENT_CPU, lambda node, job: cpu_shards(node.cpu, job) >= 1, resource=True),
    # The job's model and dataset, on the node's own disk or a shared path it mounts: shards load them at start.
    NodeFilter(ARTIFACT, PendingReason.WAITING_FOR_ARTIFACT, _has_artifacts),
    # All or nothing: a gang starts whole or not at all.
    GangFilter(TOO_FEW, PendingReason.INSUFFICIENT_GPUS, _holds_the_gang),
    # The gang's coordinator listens on a rendezvous port of its node.
    GangFilter(NO_PORT, PendingReason.NO_FIT, _can_coordinate),
)

BY_NAME: Final = {f.name: f for f in FILTERS}
STATE_FILTERS: Final = tuple(f for f in FILTERS if isinstance(f, StateFilter))
GROUP_FILTERS: Final = tuple(f for f in FILTERS if isinstance(f, GroupFilter))
BUCKET_FILTERS: Final = tuple(f for f in FILTERS if isinstance(f, BucketFilter))
NODE_FILTERS: Final = tuple(f for f in FILTERS if isinstance(f, NodeFilter))
GANG_FILTERS: Final = tuple(f for f in FILTERS if isinstance(f, GangFilter))

_past_groups = FILTERS.index(GROUP_FILTERS[-1]) + 1
IDENTITY: Final = FILTERS[:_past_groups]
"""Whether a node is one the job could use at all: up, and of the GPU kind it asks for."""
CAPACITY: Final = tuple(f for f in FILTERS[_past_groups:] if not isinstance(f, GangFilter))
"""Whether it can take the job's shards now. Each takes GPUs out of the running, in this order."""
_past_resources = max(i for i, f in enumerate(NODE_FILTERS) if f.resource) + 1
CAPPED: Final = frozenset(f.name for f in NODE_FILTERS[_past_resources:])
"""Node filters after the resource ones: a node that fails one had only its capacity to offer, not all its free GPUs."""

_FULL: Final = tuple(f for f in GROUP_FILTERS if f.match in (Match.FULL, Match.ANY))
_DEGRADED: Final = tuple(f for f in GROUP_FILTERS if f.match in (Match.DEGRADED, Match.ANY))


def state_failing(node: Node, policy: Policy) -> StateFilter | None:
    """The first state filter ``node`` fails: the one the index files it under, outside the buckets."""
    for f in STATE_FILTERS:
        if not f.check(node, policy):
            return f
    return None


def group_filters(job: Wants) -> tuple[GroupFilter, ...]:
    """The group filters ``job`` is held to: the degraded ones once it may run degraded, else the full-match ones."""
    return _DEGRADED if job.degraded else _FULL


def group_failing(group: Kind, job: Wants) -> GroupFilter | None:
    """The first group filter ``group`` fails for ``job``."""
    for f in group_filters(job):
        if not f.check(group, job):
            return f
    return None


def could_ever_use(group: Kind, job: Wants) -> bool:
    """Whether ``job`` could ever use a node of ``group``, by kind alone: it passes the full-match filters, or the
    degraded ones where the job opted in to degraded placement (its queue's quota aside: admission judges that)."""
    if all(f.check(group, job) for f in _FULL if f.match is Match.FULL):
        return True
    return job.spec.min_match is not None and all(f.check(group, job) for f in _DEGRADED if f.match is Match.DEGRADED)


def full_match(group: Kind, job: Wants) -> bool:
    """Whether ``group`` passes the full-match filters: a shard of ``job`` placed there is not degraded."""
    return all(f.check(group, job) for f in _FULL if f.match is Match.FULL)


@cache
def bucket_failing(free: int) -> BucketFilter | None:
    """The first bucket filter that nodes with ``free`` free GPUs fail (worked out once per count: it reads nothing
    else)."""
    for f in BUCKET_FILTERS:
        if not f.check(free):
            return f
    return None


def node_failing(node: Node, job: Wants) -> NodeFilter | None:
    """The first node filter ``node`` fails for ``job``."""
    for f in NODE_FILTERS:
        if not f.check(node, job):
            return f
    return None


def could_host(node: Node, job: Wants) -> bool:
    """Whether ``node`` passes the node filters that no freeing of GPUs, memory or CPU on it would cure."""
    return all(f.check(node, job) for f in NODE_FILTERS if not f.resource)


def gang_failing(members: Sequence[tuple[Node, int]], job: Wants) -> GangFilter | None:
    """The first gang filter the nodes ``members`` (each with the shards it can take) fail for ``job``."""
    for f in GANG_FILTERS:
        if not f.check(members, job):
            return f
    return None
