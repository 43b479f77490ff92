"""The dependency graph's pure functions: a held job's verdict from its parents' states, and cycle detection."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from shardyard.events import PendingReason
from shardyard.lifecycle import JobState
from shardyard.queue.dependencies import Fail, Hold, Release, Verdict, find_cycle, verdict
from tests.unit.builders import job_spec

S, F, C, R = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.RUNNING
WAIT, FAILED_DEP = PendingReason.WAITING_FOR_DEPENDENCY, PendingReason.DEPENDENCY_FAILED


def _shape(result: Verdict) -> tuple[str, PendingReason | None, tuple[str, ...]]:
    match result:
        case Release():
            return ("release", None, ())
        case Fail():
            return ("fail", None, ())
        case Hold(reason=reason, waiting_for=waiting_for):
            return ("hold", reason, waiting_for)


@pytest.mark.parametrize(
    ("depends_on", "policy", "states", "expected"),
    [
        pytest.param((), "fail", {}, ("release", None, ()), id="no-parents"),
        pytest.param(("a",), "fail", {"a": S}, ("release", None, ()), id="parent-succeeded"),
        pytest.param(("a", "b"), "fail", {"a": S, "b": S}, ("release", None, ()), id="all-succeeded"),
        pytest.param(("a",), "fail", {"a": R}, ("hold", WAIT, ("a",)), id="parent-running"),
        pytest.param(("a",), "fail", {"a": JobState.WAITING}, ("hold", WAIT, ("a",)), id="parent-waiting"),
        pytest.param(("a", "b"), "fail", {"a": S, "b": R}, ("hold", WAIT, ("b",)), id="one-left"),
        pytest.param(("a", "b"), "fail", {"a": R, "b": R}, ("hold", WAIT, ("a", "b")), id="both-left-in-order"),
        pytest.param(("a",), "fail", {}, ("hold", WAIT, ("a",)), id="unknown-parent-waits"),
        pytest.param(("a",), "fail", {"a": F}, ("fail", None, ()), id="parent-failed-fail"),
        pytest.param(("a",), "fail", {"a": C}, ("fail", None, ()), id="parent-cancelled-fail"),
        pytest.param(("a", "b"), "fail", {"a": R, "b": F}, ("fail", None, ()), id="failure-beats-unfinished"),
        pytest.param(("a",), "hold", {"a": F}, ("hold", FAILED_DEP, ("a",)), id="parent-failed-hold"),
        pytest.param(("a",), "hold", {"a": C}, ("hold", FAILED_DEP, ("a",)), id="parent-cancelled-hold"),
        pytest.param(("a", "b", "c"), "hold", {"a": F, "b": R, "c": C}, ("hold", FAILED_DEP, ("a", "c")), id="hold-2"),
        pytest.param(("a",), "hold", {"a": R}, ("hold", WAIT, ("a",)), id="hold-policy-still-waits-first"),
    ],
)
def test_verdict(
    depends_on: tuple[str, ...],
    policy: str,
    states: Mapping[str, JobState],
    expected: tuple[str, PendingReason | None, tuple[str, ...]],
) -> None:
    spec = job_spec(job_id="child", depends_on=depends_on, on_dependency_failure=policy)

    assert _shape(verdict(spec, states)) == expected


@pytest.mark.parametrize(
    ("policy", "state", "needles"),
    [
        pytest.param("fail", F, ("'prep' ended FAILED", "on_dependency_failure: fail"), id="fail-names-parent"),
        pytest.param("fail", C, ("'prep' ended CANCELLED",), id="fail-names-cancel"),
        pytest.param("hold", F, ("'prep' ended FAILED", "shardyard cancel child"), id="hold-says-how-to-cancel"),
        pytest.param("hold", R, ("waiting for dependency to succeed: 'prep'",), id="waiting-names-parent"),
    ],
)
def test_verdict_messages_name_the_parent(policy: str, state: JobState, needles: tuple[str, ...]) -> None:
    result = verdict(job_spec(job_id="child", depends_on=("prep",), on_dependency_failure=policy), {"prep": state})

    assert isinstance(result, Fail | Hold)
    for needle in needles:
        assert needle in result.message


GRAPH = {"a": ("b",), "b": ("c",), "c": (), "d": ("a", "c"), "x": ("y",), "y": ("x",)}


@pytest.mark.parametrize(
    ("start", "edges", "expected"),
    [
        pytest.param("n", (), None, id="no-parents"),
        pytest.param("n", ("a", "d"), None, id="diamond-without-cycle"),
        pytest.param("c", ("a",), ("c", "a", "b", "c"), id="closes-a-chain"),
        pytest.param("b", ("d",), ("b", "d", "a", "b"), id="through-a-diamond"),
        pytest.param("n", ("x",), None, id="cycle-elsewhere-is-not-ours"),
        pytest.param("x", ("y",), ("x", "y", "x"), id="two-cycle"),
        pytest.param("n", ("missing",), None, id="unknown-parent"),
    ],
)
def test_find_cycle(start: str, edges: tuple[str, ...], expected: tuple[str, ...] | None) -> None:
    graph = {**GRAPH, start: edges}

    assert find_cycle(start, lambda job: graph.get(job, ())) == expected


def test_find_cycle_on_a_long_chain_does_not_recurse() -> None:
    depth = 50_000
    graph = {f"j{i}": (f"j{i + 1}",) for i in range(depth)}
    graph[f"j{depth}"] = ("j0",)

    cycle = find_cycle("j0", lambda job: graph.get(job, ()))

    assert cycle is not None and len(cycle) == depth + 2
