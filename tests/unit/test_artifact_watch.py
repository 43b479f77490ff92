from __future__ import annotations

from typing import Any

import pytest

from shardyard.events import (
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
from shardyard.lifecycle import LifecycleFact
from shardyard.node_agent.artifacts import ArtifactWatch, is_shared
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
