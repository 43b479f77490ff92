"""A job's states, apart from the transition table that moves jobs between them (``shardyard.lifecycle``, which reads
the events): what reads only a state (the accounting records, ``shardyard history``) loads no event model."""

from enum import StrEnum
from typing import Final


class JobState(StrEnum):
    ACCEPTED = "ACCEPTED"
    REJECTED = "REJECTED"
    WAITING = "WAITING"
    READY = "READY"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL: Final = frozenset({JobState.REJECTED, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
