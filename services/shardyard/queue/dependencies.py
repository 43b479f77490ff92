"""The job dependency graph: what a held job's parents say it should become, and cycle detection. Pure functions.

A job's parents are its ``depends_on`` ids. A job is released when every parent SUCCEEDED; a parent that ended
FAILED or CANCELLED either fails the job too (``on_dependency_failure: fail``) or holds it, WAITING with the reason,
until a user cancels it (``hold``).
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from shardyard.events import JobSpec, PendingReason
from shardyard.lifecycle import JobState

FAILED_ENDS = frozenset({JobState.FAILED, JobState.CANCELLED})
"""Parent ends that the job can never get past."""


@dataclass(frozen=True)
class Release:
    """Every parent succeeded: the job is ready for placement."""


@dataclass(frozen=True)
class Hold:
    """The job waits: for parents still to succeed, or (``hold``) because one can no longer succeed."""

    reason: PendingReason
    waiting_for: tuple[str, ...]
    message: str


@dataclass(frozen=True)
class Fail:
    """A parent ended FAILED or CANCELLED and the job asked to fail with it."""

    message: str


Verdict = Release | Hold | Fail


def _named(ids: Iterable[str]) -> str:
    return ", ".join(repr(i) for i in ids)


def verdict(spec: JobSpec, parent_states: Mapping[str, JobState | None]) -> Verdict:
    """What ``spec``'s job should become, given the current state of each of its parents (None: unknown)."""
    ended = [(p, parent_states.get(p)) for p in spec.depends_on if parent_states.get(p) in FAILED_ENDS]
    if ended:
        ends = "; ".join(f"dependency {parent!r} ended {state}" for parent, state in ended)
        if spec.on_dependency_failure == "fail":
            return Fail(f"{ends}, so this job cannot run (on_dependency_failure: fail)")
        return Hold(
            PendingReason.DEPENDENCY_FAILED,
            tuple(parent for parent, _ in ended),
            f"{ends}; held (on_dependency_failure: hold) until cancelled: shardyard cancel {spec.job_id}",
        )
    unfinished = tuple(p for p in spec.depends_on if parent_states.get(p) is not JobState.SUCCEEDED)
    if not unfinished:
        return Release()
    noun = "dependency" if len(unfinished) == 1 else f"{len(unfinished)} dependencies"
    return Hold(
        PendingReason.WAITING_FOR_DEPENDENCY,
        unfinished,
        f"waiting for {noun} to succeed: {_named(unfinished)}",
    )


def find_cycle(start: str, parents_of: Callable[[str], Iterable[str]]) -> tuple[str, ...] | None:
    """A path ``start -> ... -> start`` along ``depends_on`` edges, or None when ``start`` is on no cycle.

    Iterative depth-first search, so a long chain of jobs cannot exhaust the interpreter's stack.
    """
    path: list[str] = [start]
    stack: list[list[str]] = [list(parents_of(start))]
    seen: set[str] = {start}
    while stack:
        frontier = stack[-1]
        if not frontier:
            stack.pop()
            path.pop()
            continue
        node = frontier.pop()
        if node == start:
            return (*path, start)
        if node in seen:
            continue
        seen.add(node)
        path.append(node)
        stack.append(list(parents_of(node)))
    return None
