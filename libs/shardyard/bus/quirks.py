"""What differs between the brokers Shardyard runs on, in one place, each difference named with its broker.

A process learns which broker it talks to from ``SHARDYARD_BROKER`` (``shardyard up`` sets it for every process it
starts: ``kafka``, ``embedded`` or ``external``); unset, it is taken for Apache Kafka. Like the transport's security
(``bus.transport``), it is read where the clients are made, so one process talks to its broker one way.

Differences that need no setting are named where they are handled (``grep -n Tansu``): its end offsets (``ListOffsets``
latest) are the base offset of a partition's last record batch plus one, not the offset after its last record; it does
not describe or alter topic configurations; a ``memory://`` log forgets everything on restart
(``bus.forgotten``, ``cli.supervisor``); it waits for connected clients before it exits.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from shardyard.bus.address import BROKER_ENV


@dataclass(frozen=True)
class FetchWaits:
    """How long a fetch may wait at the broker for data, for the consumers on the job's path (submissions at the
    queue, the scheduler's facts, an agent's assignments) and for every other (liveness, ledgers, recovery facts,
    the monitor)."""

    job_path_ms: int
    background_ms: int


KAFKA: Final = FetchWaits(job_path_ms=500, background_ms=500)
"""Apache Kafka answers a waiting fetch as soon as a record arrives (``fetch.min.bytes`` 1): the wait only sets how
often an idle consumer asks, so it stays at the clients' default."""
TANSU: Final = FetchWaits(job_path_ms=20, background_ms=200)
"""Tansu-only: it holds a fetch for about its maximum wait even when records are waiting (a median 141 ms a hop at
500 ms), so the job's path waits 20 ms (fifty small fetches a second from an idle consumer, half a millisecond of the
broker's each) and the rest 200 ms (a fact reaches them in about a tenth of a second)."""


def on_tansu(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process's broker is the embedded Tansu (for a difference handled where it shows)."""
    env = os.environ if environ is None else environ
    return env.get(BROKER_ENV, "").strip().lower() == "embedded"


def fetch_waits(environ: Mapping[str, str] | None = None) -> FetchWaits:
    return TANSU if on_tansu(environ) else KAFKA


def fetch_wait_ms(*, job_path: bool = False) -> int:
    """The fetch wait of a consumer on the job's path, or of any other, on this process's broker."""
    waits = fetch_waits()
    return waits.job_path_ms if job_path else waits.background_ms
