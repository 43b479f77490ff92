"""Queue handlers: decode, call the book, publish. No decisions here.

Every replica follows the lifecycle topic; the consumer group on the submissions topic gives each replica some of
its partitions, and a replica decides for the jobs of those partitions only."""

import logging
from collections.abc import Awaitable, Sequence
from datetime import UTC, datetime

from shardyard import metrics, tracing
from shardyard.bus.batch import Record, pace
from shardyard.bus.kafka import Bus, source_of_record
from shardyard.bus.topics import SUBMISSIONS, Topic
from shardyard.clock import Clock
from shardyard.events import JobAccepted, JobCancelRequested, JobRejected, QueuesConfigured
from shardyard.lifecycle import LifecycleFact
from shardyard.queue import team_cancel
from shardyard.queue.book import QueueBook

log = logging.getLogger(__name__)

FORWARDED_FROM = "x-shardyard-submitted-as"
"""Header of a forwarded submission: where it was first written (``topic/partition/offset``), the source that makes
its admission happen once however often it is forwarded or redelivered."""
APPENDED_AT = "x-shardyard-appended-at"
"""Header of a forwarded submission: when it first reached the log (ms), when it was submitted (``arrival``)."""


class QueueHandlers:
    def __init__(self, book: QueueBook, bus: Bus, clock: Clock) -> None:
        self.book = book
        self.bus = bus
        self.clock = clock

    async def on_submissions(self, records: Sequence[Record]) -> list[Awaitable[object]]:
        """A batch of submissions, in log order: each is admitted (or forwarded to its job's partition) and what it
        causes is handed to the producer; the acknowledgements are returned, for the bus to await before it commits
        the batch."""
        sent: list[Awaitable[object]] = []
        for index, record in enumerate(records):
            await pace(index)  # the group heartbeat runs between records, not only between batches
            sent.extend(await self.on_submission(record))
        return sent

    async def on_submission(self, record: Record) -> list[Awaitable[object]]:
        raw = record.value or b""
        headers = dict(record.headers or ())
        source = headers[FORWARDED_FROM].decode() if FORWARDED_FROM in headers else source_of_record(record)
        forward = self.book.forward_to(raw, source=source, partition=record.partition)
        if forward is not None:
            # The trace context travels on: the admission span still continues the submitter's trace.
            carried = {name: value.decode(errors="replace") for name, value in headers.items()}
            carried.setdefault(APPENDED_AT, str(record.timestamp))
            log.info("forwarding submission %s of job %r to partition %d", source, forward.job_id, forward.partition)
            metrics.SUBMISSIONS_ANSWERED.labels("forwarded", "").inc()
            return [
                await self.bus.send_raw(
                    raw,
                    SUBMISSIONS,
                    key=forward.job_id,
                    partition=forward.partition,
                    headers={**carried, FORWARDED_FROM: source},
                )
            ]
        key = record.key if not isinstance(record.key, str) else record.key.encode()
        signed = [(name, value) for name, value in (record.headers or ()) if name not in (FORWARDED_FROM, APPENDED_AT)]
        appended = appended_at(headers.get(APPENDED_AT) if FORWARDED_FROM in headers else None, record.timestamp)
        events = self.book.on_submission(
            raw, source=source, now=self.clock.now(), key=key, headers=signed, appended_at=appended
        )
        job_id = tracing.job_of(events[0]) if events else None  # no events: a redelivery, admitted before
        if job_id is None:
            refused = team_cancel.cancel_target(raw) is not None  # a team's cancel the queue refused (it logged why)
            metrics.SUBMISSIONS_ANSWERED.labels("cancel_refused" if refused else "redelivered", "").inc()
            return []
        verdict = events[0]
        if isinstance(verdict, JobRejected):
            metrics.SUBMISSIONS_ANSWERED.labels("rejected", verdict.reason.value).inc()
        elif isinstance(verdict, JobCancelRequested):
            metrics.SUBMISSIONS_ANSWERED.labels("cancel", "").inc()  # a team's signed cancel of its own job
        else:
            metrics.SUBMISSIONS_ANSWERED.labels("accepted", "").inc()
        # The admission span continues the submitter's trace (its ``traceparent`` header), or starts the job's trace
        # (a plain-JSON submission, from kcat say). Only an acceptance (re)starts the job's trace everywhere.
        with tracing.job_span(
            "admission",
            job_id,
            parent=tracing.extract(tracing.from_headers(record.headers)),
            restart=isinstance(events[0], JobAccepted),
            attributes={**tracing.event_attributes(events[0]), "shardyard.outcome": type(events[0]).__name__},
        ):
            return [await self.bus.send(event) for event in events]

    async def on_followed(self, _topic: Topic, event: LifecycleFact | QueuesConfigured) -> None:
        if isinstance(event, QueuesConfigured):
            self.book.queues = event  # admission judges queues and quotas by it from the next submission
            return
        await self.bus.publish_all(self.book.on_lifecycle(event, self.clock.now()))

    def queues_in_force(self) -> str | None:
        return None if self.book.queues is None else self.book.queues.version

    async def own(self, partitions: frozenset[int]) -> None:
        """The submissions partitions whose jobs this replica decides from now on. Given new ones (it has read the
        log), it carries out what is due for their jobs and was never published."""
        gained = partitions - (self.book.owned or frozenset())
        self.book.owned = partitions
        if not gained:
            return
        events = self.book.reconcile(self.clock.now())
        if events:
            log.info("settled on taking jobs over: %s", ", ".join(f"{type(e).__name__} {e.job_id}" for e in events))
        await self.bus.publish_all(events)


def appended_at(forwarded: bytes | None, timestamp: int) -> datetime | None:
    """When a submission first reached the log: the time its forward carried, else its record's (ms; none: None)."""
    try:
        ms = int(forwarded) if forwarded is not None else timestamp
    except ValueError:
        ms = timestamp
    return datetime.fromtimestamp(ms / 1000, UTC) if ms > 0 else None
