"""The accounting service as real processes on a real broker, writing to SQLite and to a real PostgreSQL server:
jobs that succeed, fail, succeed on a second attempt and are cancelled give their records, whether their events came
before the service started (the rebuild) or while it ran; two replicas write the same rows; a replica started again
reads the whole log again and leaves every row as it was, repairs rows that were changed or lost, and keeps the rows
of jobs the log no longer holds."""

import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from subprocess import Popen

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import SERVICES
from shardyard.events import ServiceReady
from shardyard.jobdb.query import HistoryQuery
from shardyard.jobdb.record import JobRecord
from shardyard.jobdb.store import open_store
from shardyard.jobdb.urls import sqlite_path
from shardyard.lifecycle import JobState
from tests.support.accounting import STORIES, expected
from tests.support.events import Producer, Watcher
from tests.support.postgres import throwaway_postgres
from tests.support.processes import service
from tests.support.wait import eventually
from tests.unit.builders import T0, at

pytestmark = pytest.mark.broker
RUN = uuid.uuid4().hex[:6]
"""Ids unique to this run: an outside broker (``SHARDYARD_KAFKA_BOOTSTRAP``) keeps earlier runs' events."""


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    with throwaway_postgres() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/accounting.db"
    url: str = request.getfixturevalue("postgres_url")
    return url


def rows(url: str, job_ids: set[str]) -> dict[str, JobRecord]:
    store = open_store(url, create=False)
    try:
        return {r.job_id: r for r in store.select(HistoryQuery(limit=100_000)) if r.job_id in job_ids}
    finally:
        store.close()


def delete(url: str, job_id: str) -> None:
    """A row lost behind the service's back, in SQL of the back end's own."""
    path = sqlite_path(url)
    if path is not None:
        with sqlite3.connect(path) as db:
            db.execute("DELETE FROM job_accounting WHERE job_id = ?", (job_id,))
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        db.execute("DELETE FROM job_accounting WHERE job_id = %s", (job_id,))


def accounting(name: str, url: str, bootstrap: str, log_dir: Path) -> AbstractContextManager[Popen[bytes]]:
    return service(
        "shardyard.accounting", ["--instance", name, "--accounting-url", url], bootstrap=bootstrap, log_dir=log_dir
    )


async def test_records_are_written_rebuilt_and_left_unchanged(bootstrap: str, log_dir: Path, database: str) -> None:
    await ensure_topics(bootstrap)
    backend = database.split(":", 1)[0]
    jobs = {story: f"acct-{story}-{backend}-{RUN}" for story in STORIES}
    want = {jobs[story]: expected(story, jobs[story], at(i)) for i, story in enumerate(sorted(STORIES))}
    events = {story: STORIES[story](jobs[story], at(i)) for i, story in enumerate(sorted(STORIES))}
    names = [f"acct-{backend}-{RUN}-{n}" for n in ("a", "b", "again")]

    async with Watcher(bootstrap, [SERVICES]) as watch, Producer(bootstrap) as send:
        for story in ("succeeded", "failed"):  # before the service: it finds them when it rebuilds
            for event in events[story]:
                await send.event(event)
        with accounting(names[0], database, bootstrap, log_dir), accounting(names[1], database, bootstrap, log_dir):
            for name in names[:2]:
                await watch.first(ServiceReady, service="accounting", instance=name, timeout_s=60)
            for story in ("retried", "cancelled"):  # while it runs
                for event in events[story]:
                    await send.event(event)
            written = await eventually(
                lambda: rows(database, set(want)) == want or None,
                "every job's record",
                30,
                describe=lambda: rows(database, set(want)),
            )
            assert written

        # Behind the service's back: one row lost, one taken back to RUNNING, and one of a job the log never held
        # (an earlier cluster's, whose embedded broker is gone).
        delete(database, jobs["failed"])
        writer = open_store(database, create=True)
        changed = want[jobs["retried"]]
        writer.upsert([replace(changed, state=JobState.RUNNING, ended_at=None, final_loss=None)])
        earlier = replace(want[jobs["succeeded"]], job_id=f"acct-earlier-{backend}-{RUN}", submitted_at=T0)
        writer.upsert([earlier])
        writer.close()

        with accounting(names[2], database, bootstrap, log_dir):
            await watch.first(ServiceReady, service="accounting", instance=names[2], timeout_s=60)
            # Ready means rebuilt: every record the log holds was written before the service announced itself.
            assert rows(database, set(want)) == want
            assert rows(database, {earlier.job_id}) == {earlier.job_id: earlier}
