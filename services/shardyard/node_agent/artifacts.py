"""Which job paths (pretrained models, datasets) the agent watches, and which of them it reports as present. Pure.

A job's ``spec.model_path`` and ``spec.dataset_path`` are watched from its acceptance until it ends; a path named
by several live jobs is watched until the last of them ends (reference counts). Lifecycle events move jobs through
the lifecycle transition table, as every consumer of that topic does, so a late or duplicated event can neither
revive a finished job nor (a resubmission refused as a duplicate) end a live one; success, failure and cancellation
end a job's watch whatever the table says. The edge stats the paths this
module asks about and feeds back what it found (``observe``); ``report`` is what a heartbeat carries.

A path the edge could not look at (one this node does not serve, a name too long for the filesystem, a directory it
may not read) is one job's problem, not the agent's: it counts as not present and its :class:`ArtifactError` rides
on the heartbeat (``report_errors``), so the scheduler can say why the job waits.
"""

import errno
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from shardyard.errors import JobPathError
from shardyard.events import ArtifactError, ArtifactErrorReason, ArtifactPlace, JobAccepted, JobReady
from shardyard.events.node import MAX_ARTIFACT_ERROR_CHARS, MAX_ARTIFACT_ERRORS, MAX_ARTIFACTS_ABSENT
from shardyard.lifecycle import TERMINAL, JobState, LifecycleFact, can_move, target_state

Look = bool | ArtifactError
"""What the edge found at a watched path: a directory is there (True), nothing is (False), or it could not tell."""

_OVER = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
"""Ends that hold whatever this agent saw of the job before (an event it could not read must not leak a watch)."""


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_ARTIFACT_ERROR_CHARS else text[: MAX_ARTIFACT_ERROR_CHARS - 1] + "…"


def not_served(exc: JobPathError) -> ArtifactError:
    return ArtifactError(reason=ArtifactErrorReason.NOT_SERVED, message=_bounded(str(exc)))


def unreadable(exc: OSError | ValueError) -> ArtifactError:
    """The error of a failed look, without the path (an OSError's text repeats it, and it may be 5,000 characters):
    ``ENAMETOOLONG: File name too long``. The same failure gives the same message, so a report changes only when the
    failure does."""
    if isinstance(exc, OSError) and exc.errno is not None:
        text = f"{errno.errorcode.get(exc.errno, f'errno {exc.errno}')}: {exc.strerror}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return ArtifactError(reason=ArtifactErrorReason.UNREADABLE, message=_bounded(text))


def is_shared(job_path: str, shared_prefixes: Iterable[str]) -> bool:
    """True when ``job_path`` lies under one of the prefixes, by whole components (/data/shared, not /data/sharedx)."""
    path = PurePosixPath(job_path)
    return any(path == PurePosixPath(p) or PurePosixPath(p) in path.parents for p in shared_prefixes)


@dataclass
class ArtifactWatch:
    shared_prefixes: tuple[str, ...] = ()
    """Job-path prefixes on network filesystems every node mounts: what is there is reported as ``shared``."""
    states: dict[str, JobState] = field(default_factory=dict)
    jobs: dict[str, frozenset[str]] = field(default_factory=dict)
    """Live jobs and the paths each of them names."""
    refs: Counter[str] = field(default_factory=Counter)
    present: set[str] = field(default_factory=set)
    errors: dict[str, ArtifactError] = field(default_factory=dict)
    """Watched paths that could not be looked at, and why; they are not in ``present``."""
    not_found: set[str] = field(default_factory=set)
    """Watched paths looked for and not found. A watched path in none of the three has not been looked at yet: the
    scheduler tells "absent" from "not looked at" by them (a job waits for an artifact only once it is reported
    absent)."""

    def apply(self, event: LifecycleFact) -> frozenset[str]:
        """Take one lifecycle fact; returns the paths it started watching (to be checked at once)."""
        target = target_state(event)
        if target is None:
            return frozenset()
        if target in _OVER or can_move(self.states.get(event.job_id), target):
            self.states[event.job_id] = target
        else:
            return frozenset()
        if target in TERMINAL:
            self._track(event.job_id, frozenset())
            return frozenset()
        if isinstance(event, JobAccepted | JobReady):
            return self._track(event.job_id, frozenset({event.spec.model_path, event.spec.dataset_path}))
        return frozenset()

    def ended(self, job_id: str) -> bool:
        """Whether the job's lifecycle reached its end, as far as this watch heard."""
        return self.states.get(job_id) in TERMINAL

    @property
    def watched(self) -> frozenset[str]:
        return frozenset(self.refs)

    def absent(self) -> frozenset[str]:
        """Watched paths not seen here yet: the ones to poll often. Paths in error are left to the heartbeat's look
        at every watched path: most errors (a path not served, a name too long) never go away."""
        return frozenset(path for path in self.refs if path not in self.present and path not in self.errors)

    def observe(self, found: Mapping[str, Look]) -> bool:
        """Record what the edge found at each path (paths no longer watched are ignored); True when the report or
        the errors changed."""
        before = (set(self.present), dict(self.errors), set(self.not_found))
        for path, look in found.items():
            self.not_found.discard(path)
            if isinstance(look, ArtifactError) and path in self.refs:
                self.present.discard(path)
                self.errors[path] = look
                continue
            self.errors.pop(path, None)
            if look is True and path in self.refs:
                self.present.add(path)
            else:
                self.present.discard(path)
                if path in self.refs:
                    self.not_found.add(path)
        return (self.present, self.errors, self.not_found) != before

    def report(self) -> dict[str, ArtifactPlace]:
        return {path: "shared" if is_shared(path, self.shared_prefixes) else "local" for path in sorted(self.present)}

    def report_absent(self) -> tuple[str, ...]:
        """The paths a heartbeat reports looked for and not found: the first ``MAX_ARTIFACTS_ABSENT``, sorted."""
        return tuple(sorted(self.not_found)[:MAX_ARTIFACTS_ABSENT])

    def report_errors(self) -> dict[str, ArtifactError]:
        """The errors a heartbeat carries: of the first ``MAX_ARTIFACT_ERRORS`` paths in error, in sorted order."""
        return {path: self.errors[path] for path in sorted(self.errors)[:MAX_ARTIFACT_ERRORS]}

    def _track(self, job_id: str, paths: frozenset[str]) -> frozenset[str]:
        old = self.jobs.pop(job_id, frozenset())
        if paths:
            self.jobs[job_id] = paths
        for path in old - paths:
            self.refs[path] -= 1
            if self.refs[path] <= 0:
                del self.refs[path]
                self.present.discard(path)
                self.not_found.discard(path)
                self.errors.pop(path, None)
        added = frozenset(path for path in paths - old if self.refs[path] == 0)
        for path in paths - old:
            self.refs[path] += 1
        return added
