from __future__ import annotations

import errno
from typing import Any

import pytest

from shardyard.events import (
    ArtifactError,
    ArtifactErrorReason,
    FailureCause,
    JobAccepted,
    JobCancelled,
    JobFailed,
    JobReady,
    JobRejected,
    JobRunning,
    JobSucceeded,
    RejectReason,
)
from shardyard.events.node import MAX_ARTIFACT_ERROR_CHARS, MAX_ARTIFACT_ERRORS
from shardyard.lifecycle import LifecycleFact
from shardyard.node_agent.artifacts import ArtifactWatch, is_shared, unreadable
from tests.unit.builders import T0, job_spec, scheduled

MODEL = "/data/models/gpt2"
DATA = "/data/datasets/wikitext"
OTHER = "/data/datasets/other"


def accepted(job_id: str = "job-1", model: str = MODEL, dataset: str = DATA) -> JobAccepted:
    spec = job_spec(job_id=job_id, model_path=model, dataset_path=dataset)
    return JobAccepted(occurred_at=T0, job_id=job_id, spec=spec, source_offset=f"subs/0/{job_id}")


def ready(job_id: str = "job-1", model: str = MODEL, dataset: str = DATA) -> JobReady:
    return JobReady(occurred_at=T0, job_id=job_id, spec=job_spec(job_id=job_id, model_path=model, dataset_path=dataset))


def succeeded(job_id: str = "job-1") -> JobSucceeded:
    return JobSucceeded(occurred_at=T0, job_id=job_id, attempt=1, final_loss=1.0, checkpoint_dir=None)


def failed(job_id: str = "job-1") -> JobFailed:
    return JobFailed(occurred_at=T0, job_id=job_id, attempt=1, cause=FailureCause.USER_ERROR, message="bad")


def cancelled(job_id: str = "job-1") -> JobCancelled:
    return JobCancelled(occurred_at=T0, job_id=job_id, message="by user")


def rejected(job_id: str = "job-1", reason: RejectReason = RejectReason.INVALID_VALUE) -> JobRejected:
    return JobRejected(occurred_at=T0, job_id=job_id, reason=reason, message="no", source_offset=f"subs/1/{job_id}")


def running(job_id: str = "job-1") -> JobRunning:
    return JobRunning(occurred_at=T0, job_id=job_id, attempt=1)


def fed(*events: Any) -> ArtifactWatch:
    watch = ArtifactWatch()
    for event in events:
        watch.apply(event)
    return watch


@pytest.mark.parametrize(
    ("events", "watched"),
    [
        pytest.param([], set(), id="nothing"),
        pytest.param([accepted()], {MODEL, DATA}, id="accepted"),
        pytest.param([accepted(), ready()], {MODEL, DATA}, id="accepted-ready"),
        pytest.param([accepted(), ready(), scheduled(), running()], {MODEL, DATA}, id="running-job-still-watched"),
        pytest.param([accepted(), ready(), succeeded()], set(), id="succeeded"),
        pytest.param([accepted(), failed()], set(), id="failed"),
        pytest.param([accepted(), cancelled()], set(), id="cancelled"),
        pytest.param([rejected()], set(), id="rejected-at-the-door"),
        pytest.param([accepted("a"), accepted("b", dataset=OTHER), succeeded("a")], {MODEL, OTHER}, id="refcount"),
        pytest.param([accepted("a"), accepted("b"), succeeded("a")], {MODEL, DATA}, id="shared-by-two-jobs"),
        pytest.param([accepted("a"), accepted("b"), succeeded("a"), failed("b")], set(), id="last-job-ends"),
        pytest.param([accepted(), succeeded(), succeeded()], set(), id="duplicate-end"),
        pytest.param([accepted(), succeeded(), ready()], set(), id="late-ready-does-not-revive"),
        pytest.param([accepted(), succeeded(), accepted()], set(), id="late-accepted-does-not-revive"),
        pytest.param(
            [accepted(), ready(), rejected(reason=RejectReason.DUPLICATE_JOB)],
            {MODEL, DATA},
            id="refused-duplicate-does-not-end-the-live-job",
        ),
        pytest.param([rejected(), accepted()], {MODEL, DATA}, id="corrected-resubmission"),
        pytest.param([ready()], set(), id="ready-without-acceptance-is-refused"),
        pytest.param([accepted(model=DATA)], {DATA}, id="one-path-named-twice"),
        pytest.param([accepted(), ready(), scheduled(), running(), succeeded()], set(), id="whole-lifecycle"),
    ],
)
def test_watched_paths(events: list[LifecycleFact], watched: set[str]) -> None:
    assert fed(*events).watched == watched


@pytest.mark.parametrize(
    ("events", "last", "added"),
    [
        pytest.param([], accepted(), {MODEL, DATA}, id="first-job"),
        pytest.param([accepted()], ready(), set(), id="same-job-again"),
        pytest.param([accepted("a")], accepted("b", dataset=OTHER), {OTHER}, id="only-the-new-path"),
        pytest.param([accepted()], succeeded(), set(), id="end"),
    ],
)
def test_apply_returns_the_newly_watched_paths(
    events: list[LifecycleFact], last: LifecycleFact, added: set[str]
) -> None:
    assert fed(*events).apply(last) == added


def test_presence_report_and_changes() -> None:
    watch = ArtifactWatch(shared_prefixes=("/data/shared",))
    watch.apply(accepted("a", model="/data/shared/models/m"))
    assert watch.absent() == {"/data/shared/models/m", DATA}

    assert watch.observe({"/data/shared/models/m": True, DATA: False}) is True
    assert watch.observe({"/data/shared/models/m": True, DATA: False}) is False  # nothing new
    assert watch.absent() == {DATA}
    assert watch.report() == {"/data/shared/models/m": "shared"}

    assert watch.observe({DATA: True}) is True
    assert watch.report() == {"/data/shared/models/m": "shared", DATA: "local"}

    assert watch.observe({DATA: False}) is True  # it went away
    assert watch.report() == {"/data/shared/models/m": "shared"}


def test_unwatched_paths_are_neither_reported_nor_recorded() -> None:
    watch = ArtifactWatch()
    watch.apply(accepted())
    watch.observe({MODEL: True, DATA: True})

    watch.apply(succeeded())

    assert watch.report() == {}
    assert watch.observe({MODEL: True, "/elsewhere": True}) is False
    assert watch.report() == {}


@pytest.mark.parametrize(
    ("path", "shared"),
    [
        pytest.param("/data/shared/models/m", True, id="under"),
        pytest.param("/data/shared", True, id="the-prefix-itself"),
        pytest.param("/data/sharedx/models/m", False, id="whole-components-only"),
        pytest.param("/data/models/m", False, id="elsewhere"),
        pytest.param("/nfs/datasets/d", True, id="second-prefix"),
    ],
)
def test_is_shared(path: str, shared: bool) -> None:
    assert is_shared(path, ("/data/shared", "/nfs")) is shared


NOT_SERVED = ArtifactError(reason=ArtifactErrorReason.NOT_SERVED, message="not under a mount this node serves")
TOO_LONG = unreadable(OSError(errno.ENAMETOOLONG, "File name too long", "/data/" + "x" * 5000))


def test_a_path_in_error_counts_as_absent_and_its_error_is_reported_until_it_is_looked_at_again() -> None:
    watch = fed(accepted())

    assert watch.observe({MODEL: True, DATA: TOO_LONG}) is True
    assert watch.report() == {MODEL: "local"}
    assert watch.report_errors() == {DATA: TOO_LONG}
    assert watch.absent() == frozenset()  # left to the heartbeat's look at every watched path, not polled
    assert watch.observe({MODEL: True, DATA: TOO_LONG}) is False  # the same error is no change

    assert watch.observe({DATA: NOT_SERVED}) is True  # another error is
    assert watch.observe({DATA: False}) is True  # it can be looked at now: absent, no error
    assert (watch.report_errors(), watch.absent()) == ({}, {DATA})


def test_an_error_goes_with_the_last_job_that_watched_its_path() -> None:
    watch = fed(accepted())
    watch.observe({DATA: TOO_LONG})

    watch.apply(succeeded())

    assert watch.errors == {}
    assert watch.observe({DATA: TOO_LONG}) is False  # no longer watched: not recorded
    assert watch.report_errors() == {}


def test_at_most_max_artifact_errors_are_reported_the_first_in_path_order() -> None:
    watch = fed(*(accepted(f"j{i:03}", dataset=f"/bad/{i:03}") for i in range(MAX_ARTIFACT_ERRORS + 6)))
    watch.observe({path: NOT_SERVED for path in watch.watched if path.startswith("/bad/")})

    reported = watch.report_errors()

    assert list(reported) == [f"/bad/{i:03}" for i in range(MAX_ARTIFACT_ERRORS)]
    assert len(watch.errors) == MAX_ARTIFACT_ERRORS + 6


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        pytest.param(
            OSError(errno.ENAMETOOLONG, "File name too long", "/data/" + "x" * 5000),
            "ENAMETOOLONG: File name too long",
            id="name-too-long-without-the-path",
        ),
        pytest.param(OSError(errno.EACCES, "Permission denied", "/data/x"), "EACCES: Permission denied", id="eacces"),
        pytest.param(ValueError("embedded null byte"), "ValueError: embedded null byte", id="nul"),
        pytest.param(ValueError("v" * 500), "ValueError: " + "v" * 187 + "…", id="bounded"),
    ],
)
def test_unreadable_says_why_in_a_bounded_message(exc: OSError | ValueError, message: str) -> None:
    error = unreadable(exc)
    assert (error.reason, error.message) == (ArtifactErrorReason.UNREADABLE, message)
    assert len(error.message) <= MAX_ARTIFACT_ERROR_CHARS
