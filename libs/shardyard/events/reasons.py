"""Typed reasons: why a submission was rejected, why a job waits, why a shard or job failed."""

from enum import StrEnum


class RejectReason(StrEnum):
    MALFORMED_JSON = "MALFORMED_JSON"
    NOT_AN_OBJECT = "NOT_AN_OBJECT"
    MISSING_FIELD = "MISSING_FIELD"
    WRONG_TYPE = "WRONG_TYPE"
    UNKNOWN_FIELD = "UNKNOWN_FIELD"
    INVALID_VALUE = "INVALID_VALUE"
    UNKNOWN_GPU_MODEL = "UNKNOWN_GPU_MODEL"
    SHARD_COUNT_MISMATCH = "SHARD_COUNT_MISMATCH"
    DUPLICATE_JOB = "DUPLICATE_JOB"
    UNKNOWN_DEPENDENCY = "UNKNOWN_DEPENDENCY"
    DEPENDENCY_CYCLE = "DEPENDENCY_CYCLE"
    TOO_LARGE = "TOO_LARGE"
    """Over the submission size limit; refused before parsing."""
    TOO_DEEP = "TOO_DEEP"
    """Objects and arrays nested deeper than the limit; refused before parsing."""
    TOO_MANY_FIELDS = "TOO_MANY_FIELDS"
    """More members and items than the limit; refused before parsing."""
    PATH_NOT_ALLOWED = "PATH_NOT_ALLOWED"
    """A job path outside the prefixes the operator allows."""
    ENV_NOT_ALLOWED = "ENV_NOT_ALLOWED"
    """An environment name that changes how code is loaded (``LD_*``, ``PYTHONPATH``...), not allowed here."""
    UNKNOWN_QUEUE = "UNKNOWN_QUEUE"
    """The submission names a queue the cluster's queues file does not define."""
    QUOTA_NEVER_FITS = "QUOTA_NEVER_FITS"
    """The job needs more GPUs of a model than its queue could ever hold (nominal quota plus all it may borrow)."""
    UNAUTHENTICATED = "UNAUTHENTICATED"
    """Unsigned where the cluster takes no anonymous submissions (or not into that queue), signed with a key the
    credentials do not hold or have revoked, badly signed, or out of its time to live."""
    FORBIDDEN = "FORBIDDEN"
    """Signed by one team for another team's queue."""
    REPLAYED = "REPLAYED"
    """A signature already used: the same signed submission produced again."""


class PendingReason(StrEnum):
    """Why a job is not running yet. The scheduler and the queue keep one current reason per pending job."""

    NO_NODES = "NO_NODES"
    NO_FIT = "NO_FIT"
    NEVER_FITS = "NEVER_FITS"
    """No set of the cluster's nodes could hold the gang even were every one of them up, idle and empty: by GPU model,
    TFLOPS (down to the job's ``min_match`` floor), GPU count, memory or CPU against the whole inventory (Kueue calls
    these inadmissible). The job waits while capacity may still change (a node joining, the autoscaler) and ends
    ``UNSCHEDULABLE`` once it has for the scheduler's ``unschedulable_after_s``."""
    GPU_MODEL_MISMATCH = "GPU_MODEL_MISMATCH"
    INSUFFICIENT_TFLOPS = "INSUFFICIENT_TFLOPS"
    INSUFFICIENT_GPUS = "INSUFFICIENT_GPUS"
    INSUFFICIENT_MEMORY = "INSUFFICIENT_MEMORY"
    INSUFFICIENT_CPU = "INSUFFICIENT_CPU"
    LOAD_TOO_HIGH = "LOAD_TOO_HIGH"
    WAITING_FOR_ARTIFACT = "WAITING_FOR_ARTIFACT"
    WAITING_FOR_DEPENDENCY = "WAITING_FOR_DEPENDENCY"
    DEPENDENCY_FAILED = "DEPENDENCY_FAILED"
    RESERVED_FOR_HIGHER_PRIORITY = "RESERVED_FOR_HIGHER_PRIORITY"
    PREEMPTING = "PREEMPTING"
    RETRY_BACKOFF = "RETRY_BACKOFF"
    DISK_FULL = "DISK_FULL"
    """Every node that could take the job has less free space on its output disk (where checkpoints and outputs go)
    than the floor: the message names them. The job starts once a disk has room."""
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    """The job's queue holds its quota of the GPU model (nominal, plus what it may borrow now) or its CPU or memory
    quota: the message names the queue and the model. The job starts once its queue's jobs end or quota comes idle."""


class FailureCause(StrEnum):
    PROCESS_EXIT = "PROCESS_EXIT"
    KILLED = "KILLED"
    USER_ERROR = "USER_ERROR"
    COMM_ERROR = "COMM_ERROR"
    NODE_LOST = "NODE_LOST"
    MISSING_ARTIFACT = "MISSING_ARTIFACT"
    LAUNCH_ERROR = "LAUNCH_ERROR"
    DEPENDENCY_FAILED = "DEPENDENCY_FAILED"
    OOM = "OOM"
    GPU_FAULT = "GPU_FAULT"
    SYNC_TIMEOUT = "SYNC_TIMEOUT"
    REVOKED = "REVOKED"
    FENCED = "FENCED"
    """The shard stopped because its node lost the bus: its agent, or the shard itself, fenced it once the lease ran
    out. Nobody re-forms the gang on purpose, so the fault manager does."""
    START_TIMEOUT = "START_TIMEOUT"
    """Reported by the scheduler, not an agent: the shard was not reported started within the start deadline of its
    assignment (its agent took it and died or hung), so the scheduler revoked it."""
    ORPHANED = "ORPHANED"
    """Reported by the scheduler, not an agent: past its start deadline, the shard's node has not reported it running
    for longer than the reservation grace (its agent restarted, or its process vanished without a report), so the
    scheduler revoked it and its GPUs came free."""
    INVALID_SPEC = "INVALID_SPEC"
    """Reported by the scheduler on a job it could not decide for: its spec breaks placement (a value no admission
    accepts, e.g. a ready job produced straight to the lifecycle topic). The job fails; the other jobs are placed."""
    DISK_FULL = "DISK_FULL"
    """A write failed for want of space (``ENOSPC``, ``EDQUOT``), or the shard failed while its node's output disk
    was full: the message names the path and the free space left. The job moves to a node with room outside its
    retry budget, or waits until a disk has room (``shardyard.fault_manager.recovery.free_move``): never retried on
    the same full disk."""
    IO_ERROR = "IO_ERROR"
    UNSCHEDULABLE = "UNSCHEDULABLE"
    """Reported by the scheduler, not an agent: the job waited ``NEVER_FITS`` for the scheduler's
    ``unschedulable_after_s`` (no set of the cluster's nodes could ever hold it, and none joined that could)."""
    BROKER_LOG_LOST = "BROKER_LOG_LOST"
    """Reported by accounting, not an agent: the broker lost the log that held the job (an embedded broker
    restarted, a cluster started afresh), so nothing is left to run or end it; its record ends with this cause."""
    STRAGGLER = "STRAGGLER"
    """Decided by the fault manager, not reported: one rank held its gang back (``JobStraggling``); the gang is
    re-formed without it, from the members' live state, and no retry is spent."""
