"""Monitor handlers: every record the feed reads is decoded and folded into the cluster view.

A record that is not an event of its topic goes to the dead-letter topic, as a FastStream subscription of the bus
would send it, and the records after it are folded. The trace context the lifecycle's events carry is recorded
(``tracing.observe``): a job that ends gets its goodput ledger as spans of its trace (``goodput.trace_ledger``),
from one replica (the job id's hash, of the replicas' share), for an end read live (appended since this replica
started), so a replica that rebuilds sends none again.
"""

import logging
import time
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

from prometheus_client import Counter

from shardyard import metrics, tracing
from shardyard.bus.codec import decode
from shardyard.bus.seal import FORGED_HEADER, Refusal, Seal, screen_read
from shardyard.bus.topics import LIFECYCLE, MONITOR_LETTERS, Topic, dead_letterer
from shardyard.errors import EventDecodeError
from shardyard.events import JobCancelled, JobFailed, JobSucceeded
from shardyard.monitor.feed import Record
from shardyard.monitor.goodput import trace_ledger
from shardyard.monitor.views import ClusterView

log = logging.getLogger(__name__)


class DeadLetters(Protocol):
    """What the handlers need of the bus (``shardyard.bus.kafka.Bus`` has it)."""

    async def dead_letter_record(self, raw: bytes, record: Record, error: str) -> None: ...

    async def refuse(self, raw: bytes, record: Record, why: Refusal) -> None: ...


class MonitorHandlers:
    def __init__(
        self,
        view: ClusterView,
        events: Counter,
        bus: DeadLetters,
        seal: Seal | None = None,
        *,
        share: tuple[int, int] = (0, 1),
        since_ms: int = 0,
    ) -> None:
        self.view = view
        self.events = events
        self.bus = bus
        self.seal = seal
        """Checks each event's seal, and a dead letter's before it counts as a forged event (``bus.seal``)."""
        self.share = share
        """(this replica, of how many): it dead-letters the bad records of the partitions ``p % many == this`` of
        the topics that are the monitor's to dead-letter (``topics.dead_letterer``); the others skip them."""
        self.since_ms = since_ms
        """Records appended before this (ms; this replica's start) were dead-lettered by whoever read them then."""

    def letters(self, topic: Topic, record: Record) -> bool:
        """Whether this replica dead-letters ``record`` if it is bad: one dead letter a bad record, cluster-wide."""
        this, many = self.share
        return (
            dead_letterer(topic.name) == MONITOR_LETTERS
            and record.partition % many == this
            and record.timestamp >= self.since_ms
        )

    async def on_records(self, topic: Topic, records: Sequence[Record]) -> None:
        """Fold a batch of one topic's records, in order."""
        if topic.payload is None:  # the dead-letter topic: raw bytes, counted by the topic they came from
            for record in records:
                headers = {name: value.decode(errors="replace") for name, value in record.headers or ()}
                source = headers.get("x-shardyard-source", "unknown/0/0").rsplit("/", 2)[0]
                at = datetime.fromtimestamp(record.timestamp / 1000, UTC)
                service, error = headers.get("x-shardyard-service", "?"), headers.get("x-shardyard-error", "")
                forged = FORGED_HEADER in headers and self._sealed(record)
                self.view.dead_letter(source, at, service, error, forged=forged)
            metrics.handled(topic.name, [0.0] * len(records))
            return
        seconds: list[float] = []
        refused: list[tuple[Record, str]] = []
        unsealed: list[tuple[Record, Refusal]] = []
        for record in records:
            began = time.perf_counter()
            try:
                event = decode(topic, record.value or b"")
                why = screen_read(self.seal, topic.name, record, record.value or b"", event)
                if why is None:
                    self.view.apply(event)
                    if topic.name == LIFECYCLE.name:
                        self._traced(record, event)
                else:
                    unsealed.append((record, why))
            except EventDecodeError as exc:
                refused.append((record, str(exc)))
            except Exception as exc:  # a bug in a fold must not stop the monitor: the record is kept aside
                log.exception("monitor: folding %s/%d/%d failed", record.topic, record.partition, record.offset)
                refused.append((record, f"handler failed: {exc!r}"))
            seconds.append(time.perf_counter() - began)
        if len(refused) + len(unsealed) < len(records):  # counted once folded: a refused record is not consumed
            self.events.labels(topic.name).inc(len(records) - len(refused) - len(unsealed))
        metrics.handled(topic.name, seconds)
        for record, error in refused:
            if self.letters(topic, record):
                log.warning(
                    "monitor: dead-lettering %s/%d/%d: %s", record.topic, record.partition, record.offset, error
                )
                await self.bus.dead_letter_record(record.value or b"", record, error)
        for record, why in unsealed:
            if self.letters(topic, record):
                await self.bus.refuse(record.value or b"", record, why)

    def _traced(self, record: Record, event: object) -> None:
        """Record the job's trace context; at its end, read live and this replica's to trace, its ledger's spans."""
        tracing.observe(event, record.headers)
        if not isinstance(event, JobSucceeded | JobFailed | JobCancelled) or record.timestamp < self.since_ms:
            return
        this, many = self.share
        if zlib.crc32(event.job_id.encode()) % many == this:
            trace_ledger(self.view.goodput, event.job_id)

    def _sealed(self, record: Record) -> bool:
        """Whether a dead letter comes from a component of this cluster: its own seal verifies (anyone can write a
        dead letter that says forged; only a component's counts). Without a secret here, any counts."""
        if self.seal is None:
            return True
        _sealer, why = self.seal.check(record.topic, record.key, record.value or b"", record.headers)
        return why is None
