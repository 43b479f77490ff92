"""When a submission was made: the moment its record reached the log, not the moment a queue replica read it."""

from datetime import datetime, timedelta

MAX_SUBMISSION_AGE = timedelta(hours=24)
"""A record's time earlier than this before it is read is not believed (a producer's own clock, on the embedded
broker): the submission counts from this far back at most."""


def submitted_when(appended_at: datetime | None, now: datetime) -> datetime:
    """When a submission was made: its record's append time (the broker's clock on Apache Kafka, the producer's on
    the embedded broker), never later than ``now`` nor more than ``MAX_SUBMISSION_AGE`` before it; ``now`` when the
    record carries none. A queue replica that died, or a backlog, leaves submissions unread a while: they waited
    from the moment they reached the log, and the job's life (its goodput ledger, its wait) counts from there."""
    if appended_at is None:
        return now
    return min(now, max(appended_at, now - MAX_SUBMISSION_AGE))
