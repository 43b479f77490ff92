"""The accounting database on SQLite (a real file, no server) and the filters readers ask with: rows round-trip,
an upsert of the same rows changes nothing, an older revision never replaces a newer one, and ``--since``,
``--state``, ``--job`` and ``--limit`` select what they say."""

import multiprocessing
import sqlite3
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shardyard.errors import AccountingError, ConfigError
from shardyard.jobdb import sql
from shardyard.jobdb.query import HistoryQuery, parse_since, query_of
from shardyard.jobdb.record import COLUMNS
from shardyard.jobdb.sqlite import SqliteStore
from shardyard.jobdb.store import open_store
from shardyard.jobdb.urls import default_url, redacted, sqlite_path
from shardyard.lifecycle import JobState
from tests.support.accounting import STORIES, expected
from tests.unit.builders import T0, at

NOW = datetime(2026, 5, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "instant"),
    [
        ("90s", NOW - timedelta(seconds=90)),
        ("15m", NOW - timedelta(minutes=15)),
        ("2h", NOW - timedelta(hours=2)),
        ("1h30m", NOW - timedelta(minutes=90)),
        ("7d", NOW - timedelta(days=7)),
        ("1w", NOW - timedelta(weeks=1)),
        ("0.5h", NOW - timedelta(minutes=30)),
        ("2026-04-30", datetime(2026, 4, 30, tzinfo=UTC)),
        ("2026-04-30T10:00:00+02:00", datetime(2026, 4, 30, 8, tzinfo=UTC)),
    ],
    ids=str,
)
def test_since_is_a_duration_back_or_an_iso_time(text: str, instant: datetime) -> None:
    assert parse_since(text, NOW) == instant


@pytest.mark.parametrize(
    ("params", "problem"),
    [({"since": "yesterday"}, "--since"), ({"state": "DONE"}, "--state"), ({"limit": "0"}, "--limit")],
    ids=["since", "state", "limit"],
)
def test_a_filter_that_cannot_be_used_is_refused_naming_it(params: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        query_of(params, NOW)


def test_the_table_has_a_type_for_every_column_in_order() -> None:
    assert tuple(sql.TYPES) == COLUMNS


@pytest.mark.parametrize(
    ("url", "path"),
    [("sqlite:///tmp/a.db", Path("/tmp/a.db")), ("sqlite:rel/a.db", Path("rel/a.db")), ("/x/a.db", Path("/x/a.db"))],
    ids=str,
)
def test_sqlite_urls_name_their_file(url: str, path: Path) -> None:
    assert sqlite_path(url) == path


def test_urls_lose_their_password_in_messages_and_a_default_is_in_the_run_folder(tmp_path: Path) -> None:
    assert redacted("postgresql://acct:s3cret@db:5432/jobs") == "postgresql://acct:***@db:5432/jobs"
    assert sqlite_path(default_url(tmp_path)) == tmp_path.resolve() / "accounting.db"
    with pytest.raises(AccountingError, match="sqlite:///PATH or postgresql"):
        open_store("mysql://db/jobs", create=True)


def test_a_reader_does_not_create_the_database(tmp_path: Path) -> None:
    with pytest.raises(AccountingError, match="no accounting database at"):
        open_store(f"sqlite://{tmp_path}/missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()


def test_rows_round_trip_and_upserts_are_idempotent_and_never_go_back(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/accounting.db"
    rows = [expected(story, f"job-{story}", T0) for story in sorted(STORIES)]
    writer = open_store(url, create=True)
    writer.upsert(rows)
    writer.upsert(rows)  # the same records again: one row each, unchanged
    older = replace(rows[0], state=JobState.RUNNING, revision=rows[0].revision - 1, ended_at=None)
    writer.upsert([older])  # a replica that is behind
    reader = open_store(url, create=False)
    assert sorted(reader.select(HistoryQuery()), key=lambda r: r.job_id) == rows
    writer.close()
    reader.close()


def test_filters_select_what_they_say(tmp_path: Path) -> None:
    store = open_store(f"sqlite://{tmp_path}/accounting.db", create=True)
    rows = {story: expected(story, f"job-{story}", at(index * 100)) for index, story in enumerate(sorted(STORIES))}
    running = replace(rows["succeeded"], job_id="job-running", state=JobState.RUNNING, ended_at=None, run_s=None)
    store.upsert([*rows.values(), running])

    def ids(**params: str) -> list[str]:
        return [r.job_id for r in store.select(query_of(params, NOW))]

    # Newest submission first (job-running was submitted with job-succeeded: by job id then).
    assert ids() == ["job-running", "job-succeeded", "job-retried", "job-failed", "job-cancelled"]
    assert ids(state="failed") == ["job-failed"]
    assert ids(job="job-retried") == ["job-retried"]
    # Since a moment after the failed job ended (t=100+1800): it and the cancelled one (t=30) are left out.
    since = at(100 + 1800 + 1).isoformat()
    assert ids(since=since) == ["job-running", "job-succeeded", "job-retried"]
    assert ids(since=since, state="SUCCEEDED") == ["job-succeeded", "job-retried"]
    assert ids(limit="2") == ["job-running", "job-succeeded"]
    store.close()


def _open_new(path: str) -> str | None:
    try:
        SqliteStore(Path(path), create=True).close()
    except AccountingError as exc:
        return str(exc)
    return None


def test_writers_opening_a_new_file_at_once_all_get_it(tmp_path: Path) -> None:
    """``up`` starts two accounting replicas together: both must open the new file (before: "database is locked", 2
    of 120 simultaneous opens)."""
    failed: list[str] = []
    with multiprocessing.get_context("fork").Pool(12) as pool:
        for round_ in range(200):
            path = str(tmp_path / f"accounting-{round_}.db")
            failed += [why for why in pool.map(_open_new, [path] * 12) if why]
    assert failed == []


def test_a_table_of_an_earlier_version_gets_the_columns_it_lacks(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    columns = ", ".join(f"{name} {sql.TYPES[name][sql.SQLITE]}" for name in sql.TYPES if name not in sql.ADDED_LATER)
    old.execute(f"CREATE TABLE {sql.TABLE} ({columns}, PRIMARY KEY (job_id, submitted_at))")
    old.execute(
        f"INSERT INTO {sql.TABLE} (job_id, submitted_at, state, gpus, attempts, gpu_hours, revision, message)"
        " VALUES ('old-job', '2026-01-01T00:00:00.000000+00:00', 'SUCCEEDED', 1, 1, 0.5, 3, '')"
    )
    old.commit()
    old.close()

    store = SqliteStore(path, create=True)
    try:
        (record,) = store.select(HistoryQuery(job_id="old-job"))
        assert (record.state, record.owner, record.key_id) == (JobState.SUCCEEDED, None, None)
        store.upsert([replace(record, revision=4, owner="alice", key_id="k2")])
        (again,) = store.select(HistoryQuery(job_id="old-job"))
        assert (again.owner, again.key_id) == ("alice", "k2")
    finally:
        store.close()
