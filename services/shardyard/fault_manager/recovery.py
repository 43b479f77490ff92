"""Recovery rules: what each failure cause means for the job, which nodes a recovery avoids, how long a retry waits,
which recoveries the retry budget pays for (not a move off a full disk, :func:`free_move`), and the outcome of one
failed attempt: a recovery plan, or the job's end. Pure: time comes in, events go out.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from shardyard.events import FailureCause, JobFailed, JobRecovering, NodeStatus, ShardCause


class Disposition(StrEnum):
    RETRY = "RETRY"
    """Infrastructure or transient: re-form the gang (a spare, or re-placement) and resume from the checkpoint."""
    FAIL = "FAIL"
    """The job's own fault: every retry would fail the same way, so the job ends at once."""
    IGNORE = "IGNORE"
    """Not a fault: the shard was stopped on purpose; whoever stopped it carries the job on."""


DISPOSITION: Final[Mapping[FailureCause, Disposition]] = MappingProxyType(
    {
        # The process exited non-zero for a reason the agent could not classify further.
        FailureCause.PROCESS_EXIT: Disposition.RETRY,
        # Killed by a signal (the OOM killer aside): an operator, a runaway neighbour, a dying host.
        FailureCause.KILLED: Disposition.RETRY,
        # The training script itself failed (bad config, exception in user code): it would fail anywhere.
        FailureCause.USER_ERROR: Disposition.FAIL,
        # A peer went away under the collective; usually a symptom of another shard's failure.
        FailureCause.COMM_ERROR: Disposition.RETRY,
        # The node stopped heartbeating with the shard on it.
        FailureCause.NODE_LOST: Disposition.RETRY,
        # The model or dataset the job names does not exist: no node can fix that.
        FailureCause.MISSING_ARTIFACT: Disposition.FAIL,
        # The agent could not start the process (ports, environment, devices) on that node.
        FailureCause.LAUNCH_ERROR: Disposition.RETRY,
        # A parent job failed: the job cannot run at all (normally decided by the queue, never by a shard).
        FailureCause.DEPENDENCY_FAILED: Disposition.FAIL,
        # Out of memory (host or GPU) on that node.
        FailureCause.OOM: Disposition.RETRY,
        # NVML reported the GPU unhealthy (Xid, ECC).
        FailureCause.GPU_FAULT: Disposition.RETRY,
        # A parameter sync did not complete in time: a slow or stuck peer.
        FailureCause.SYNC_TIMEOUT: Disposition.RETRY,
        # The scheduler revoked the shard (preemption past its deadline, cancellation, the job's end).
        FailureCause.REVOKED: Disposition.IGNORE,
        # Fenced: the node's agent lost the bus and its shards stopped (lease). The node is usually suspected and the
        # gang re-formed already; when it was not (a pool handover, a short pause), this re-forms it.
        FailureCause.FENCED: Disposition.RETRY,
        # The shard was not reported started within its start deadline (its agent died or hung before starting it):
        # the scheduler revoked it and reports this on the agent's behalf.
        FailureCause.START_TIMEOUT: Disposition.RETRY,
        # Past its start deadline the shard's node stopped reporting it running, and no end was reported (its agent
        # restarted, its process vanished): the scheduler revoked it and reports this on the agent's behalf. The node
        # is alive and heartbeating, so it is not excluded.
        FailureCause.ORPHANED: Disposition.RETRY,
        # The scheduler could not decide for the job at all (its spec breaks placement): it would break it anywhere.
        FailureCause.INVALID_SPEC: Disposition.FAIL,
        # The node's disk filled (ENOSPC, EDQUOT): the job is fine, the disk is not. Moved to a disk with room (see
        # ``free_move``), or held by the placement's disk filter until one has room.
        FailureCause.DISK_FULL: Disposition.RETRY,
        # The node's disk failed (EIO, or went read-only): retried elsewhere.
        FailureCause.IO_ERROR: Disposition.RETRY,
        # Accounting's end of a job whose log the broker lost: no shard reports it, and nothing is left to retry.
        FailureCause.BROKER_LOG_LOST: Disposition.FAIL,
        # The scheduler's end of a job no set of the cluster's nodes could hold for its bound: it ran nowhere.
        FailureCause.UNSCHEDULABLE: Disposition.FAIL,
        # The fault manager's own swap of a straggler (``fault_manager.stragglers``): no shard reports it; the gang is
        # re-formed without the slow rank, outside the retry budget.
        FailureCause.STRAGGLER: Disposition.RETRY,
    }
)

EXCLUDES_NODE: Final = frozenset(
    {
        FailureCause.GPU_FAULT,  # broken hardware stays broken
        FailureCause.LAUNCH_ERROR,  # the node cannot start shards: its environment is broken
        FailureCause.OOM,  # the node's memory (other tenants, a smaller GPU) would likely run out again
        FailureCause.NODE_LOST,  # the node is gone
        FailureCause.START_TIMEOUT,  # the node took the shard and never started it: its agent is dead or stuck
        FailureCause.IO_ERROR,  # a failing disk stays failing
    }
)
"""Causes that keep the recovered gang off the node the shard failed on. PROCESS_EXIT and KILLED say nothing about
the node; COMM_ERROR and SYNC_TIMEOUT are reported by the victims, not the culprit. DISK_FULL keeps the next attempt
off the node only when it moves the job elsewhere (``avoid_nodes``): a full disk is cleaned up, and while it is full
the placement's disk filter keeps every job off it."""

BAD_NODE: Final = frozenset({NodeStatus.SUSPECT, NodeStatus.LOST})


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 3
    """Recoveries a job gets; the failure after the last one ends it FAILED."""
    backoff_s: float = 2.0
    """Wait before the second retry (the first one is immediate); it doubles for each retry after."""
    backoff_max_s: float = 30.0
    comm_grace_s: float = 3.5
    """How long an attempt whose failures are all COMM_ERRORs, one from each of its training shards, waits for its
    culprit to show (a node turning SUSPECT, a non-COMM failure) before it is recovered without exclusions."""
    silent_grace_s: float = 10.0
    """The same wait while some training shard has reported nothing. A shard whose peers lost it and that says
    nothing itself is most likely on a dead node, whose SUSPECT verdict the resource pool gives within
    ``suspect_after_s`` (3 s) of its last heartbeat, later on a loaded or failing-over control plane: the plan waits
    for that verdict, which keeps the recovered gang off the node, rather than race it."""
    disk_floor_bytes: int = 1 << 30
    """A node has room for a job moved off a full disk when its output disk reports this much free (the scheduler's
    disk filter takes the same floor)."""
    disk_full_moves: int = 3
    """Moves off a full disk a job gets outside its retry budget; past them a DISK_FULL counts like any failure, so
    that disks filling one after another still end the job."""

    def backoff(self, retry: int) -> timedelta:
        """The wait before the ``retry``-th retry (1-based): 0, then backoff_s, doubling, capped."""
        if retry <= 1:
            return timedelta(0)
        return timedelta(seconds=min(self.backoff_max_s, self.backoff_s * 2 ** (retry - 2)))


@dataclass(frozen=True)
class FailedAttempt:
    """Everything known about one failed attempt of a job, at the moment its outcome is decided."""

    job_id: str
    attempt: int
    causes: tuple[ShardCause, ...]
    """This attempt's failures, in the order they arrived (at most one per shard)."""
    bad_nodes: frozenset[str]
    """Nodes of the gang (or of the failures) that are SUSPECT or LOST now."""
    retries_used: int
    """Recoveries the job already had."""
    earlier_causes: tuple[ShardCause, ...] = ()
    """Every cause of the job's earlier failed attempts, oldest first."""
    room: tuple[str, ...] = ()
    """Only for a DISK_FULL attempt: the ALIVE, undrained nodes outside the job's exclusions whose output disk
    reports at least ``disk_floor_bytes`` free, where the job can move."""
    moves_used: int = 0
    """Moves off a full disk the job already had (``free_move``)."""


def disposition(cause: FailureCause) -> Disposition:
    return DISPOSITION[cause]


def only_comm_errors(causes: Iterable[ShardCause]) -> bool:
    return all(c.cause is FailureCause.COMM_ERROR for c in causes)


def fatal_cause(causes: Iterable[ShardCause]) -> ShardCause | None:
    """The first cause that ends the job without a retry, if any."""
    return next((c for c in causes if disposition(c.cause) is Disposition.FAIL), None)


def root_cause(causes: Sequence[ShardCause]) -> ShardCause:
    """The failure that most likely brought the gang down: the first that is not a peer's COMM_ERROR."""
    return next((c for c in causes if c.cause is not FailureCause.COMM_ERROR), causes[0])


def full_disks(causes: Iterable[ShardCause]) -> tuple[str, ...]:
    """The nodes where a shard of the attempt failed DISK_FULL."""
    return tuple(sorted({c.node_id for c in causes if c.cause is FailureCause.DISK_FULL}))


def free_move(failed: FailedAttempt, policy: RetryPolicy) -> bool:
    """Whether the attempt is recovered by a move off a full disk, outside the retry budget: its failures are
    DISK_FULL (and the peers' COMM_ERRORs that follow), another node has room (``failed.room``), and the job has
    moves left. A crash says the job may fail again anywhere; a full disk says nothing against the job, and spending
    its retries on it, seconds apart, would end it FAILED on a cluster with room."""
    causes = failed.causes
    disk_full = any(c.cause is FailureCause.DISK_FULL for c in causes)
    echoes_only = all(c.cause in (FailureCause.DISK_FULL, FailureCause.COMM_ERROR) for c in causes)
    return disk_full and echoes_only and bool(failed.room) and failed.moves_used < policy.disk_full_moves


def exclusions(causes: Iterable[ShardCause], bad_nodes: Iterable[str]) -> tuple[str, ...]:
    """Nodes the recovered gang must avoid: where a node-bound cause struck, and every SUSPECT or LOST node."""
    return tuple(sorted({c.node_id for c in causes if c.cause in EXCLUDES_NODE} | set(bad_nodes)))


def is_due(
    causes: Sequence[ShardCause],
    bad_nodes: frozenset[str],
    first_at: datetime,
    policy: RetryPolicy,
    now: datetime,
    *,
    silent: bool = False,
) -> bool:
    """Whether a failed attempt can be decided now. Peers of a dead shard report COMM_ERROR first, so an attempt
    with nothing else waits for its culprit: a failure of another kind, or a gang node turning SUSPECT or LOST
    (``bad_nodes``: those hosting its training shards), which the plan then excludes. It waits up to
    ``comm_grace_s``, or up to ``silent_grace_s`` while some training shard has reported nothing (``silent``)."""
    if not only_comm_errors(causes) or bad_nodes:
        return True
    grace = policy.silent_grace_s if silent else policy.comm_grace_s
    return now >= first_at + timedelta(seconds=grace)


def describe(cause: ShardCause) -> str:
    return f"shard {cause.shard_index} on {cause.node_id}: {cause.cause.value}: {cause.message}"


def _summary(causes: Sequence[ShardCause], root: ShardCause) -> str:
    others = len(causes) - 1
    return describe(root) + (f" (+{others} more)" if others else "")


def outcome(failed: FailedAttempt, policy: RetryPolicy, now: datetime) -> JobRecovering | JobFailed:
    """The decision for a failed attempt: the job's end when a cause is fatal or the retry budget is spent,
    else the next recovery plan."""
    causes = failed.causes
    fatal = fatal_cause(causes)
    if fatal is not None:
        return JobFailed(
            occurred_at=now,
            job_id=failed.job_id,
            attempt=failed.attempt,
            cause=fatal.cause,
            message=f"not retried: {describe(fatal)}",
            causes=failed.earlier_causes + causes,
        )
    root = root_cause(causes)
    if free_move(failed, policy):
        return _move(failed, policy, root, now)
    if failed.retries_used >= policy.max_retries:
        attempts = failed.retries_used + 1
        return JobFailed(
            occurred_at=now,
            job_id=failed.job_id,
            attempt=failed.attempt,
            cause=root.cause,
            message=f"failed after {attempts} attempt{'s' if attempts > 1 else ''} "
            f"(retry budget {policy.max_retries} spent); last: {_summary(causes, root)}",
            causes=failed.earlier_causes + causes,
        )
    retry = failed.retries_used + 1
    wait = policy.backoff(retry)
    return JobRecovering(
        occurred_at=now,
        job_id=failed.job_id,
        attempt=failed.attempt,
        cause=root.cause,
        message=f"attempt {failed.attempt} failed: {_summary(causes, root)}; "
        f"retry {retry} of {policy.max_retries} in {wait.total_seconds():g}s",
        causes=causes,
        exclude_nodes=exclusions(causes, failed.bad_nodes),
        retry_at=now + wait,
        retries_used=retry,
        retries_left=policy.max_retries - retry,
    )


def _move(failed: FailedAttempt, policy: RetryPolicy, root: ShardCause, now: datetime) -> JobRecovering:
    """The plan that moves a job off a full disk at once, to the nodes with room: the full ones are avoided for the
    next attempt, no backoff applies and the retry budget is untouched."""
    shown = ", ".join(failed.room[:3]) + (f" and {len(failed.room) - 3} more" if len(failed.room) > 3 else "")
    move = failed.moves_used + 1
    return JobRecovering(
        occurred_at=now,
        job_id=failed.job_id,
        attempt=failed.attempt,
        cause=root.cause,
        message=f"attempt {failed.attempt} failed: {_summary(failed.causes, root)}; moving off the full disk at once "
        f"(room on {shown}), not counted against the retry budget (move {move} of {policy.disk_full_moves})",
        causes=failed.causes,
        exclude_nodes=exclusions(failed.causes, failed.bad_nodes),
        avoid_nodes=full_disks(failed.causes),
        retry_at=now,
        retries_used=failed.retries_used,
        retries_left=max(0, policy.max_retries - failed.retries_used),
        counted=False,
    )
