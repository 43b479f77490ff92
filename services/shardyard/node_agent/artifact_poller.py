"""Looking for the job paths the agent watches (:mod:`.artifacts`) on this node's disk. A path that appears or goes
away changes what the next heartbeat reports; the caller sends one at once when it did.

Lifecycle events say which paths live jobs need; a new one is looked at at once, the absent ones every poll, and
every watched one at each heartbeat (those that went away, too). Each look runs in a thread: a network filesystem
may be slow."""

import asyncio
import logging
from collections.abc import Iterable, Mapping

from shardyard.events import ArtifactError
from shardyard.lifecycle import LifecycleFact
from shardyard.node_agent.artifacts import ArtifactWatch
from shardyard.node_agent.mounts import PathProbe, look

log = logging.getLogger(__name__)


def _shown(job_path: str, limit: int = 120) -> str:
    """A job path for a log line: a path of thousands of characters is cut, with its length said."""
    return repr(job_path) if len(job_path) <= limit else f"{job_path[:limit]!r}... ({len(job_path)} characters)"


class ArtifactPoller:
    def __init__(self, watch: ArtifactWatch, mounts: Mapping[str, str], disk: PathProbe) -> None:
        self.watch = watch
        self.mounts = mounts
        self.disk = disk

    async def learn(self, event: LifecycleFact) -> bool:
        """Take a lifecycle fact; True when a path it started watching is here (the report changed)."""
        return await self._look(self.watch.apply(event))

    async def poll(self) -> bool:
        """Look for the watched paths not here yet; True when one appeared."""
        return await self._look(self.watch.absent())

    async def look_watched(self) -> bool:
        """Look at every watched path; True when the report changed."""
        return await self._look(self.watch.watched)

    async def _look(self, job_paths: Iterable[str]) -> bool:
        """Stat ``job_paths`` and record it; True when it changed. A path that cannot be looked at is that path's
        error, logged when it first appears (not at every poll)."""
        paths = list(job_paths)
        if not paths:
            return False
        mounts, disk = self.mounts, self.disk
        found = await asyncio.to_thread(lambda: {path: look(path, mounts, disk) for path in paths})
        for path, seen in found.items():
            if isinstance(seen, ArtifactError) and self.watch.errors.get(path) != seen:
                log.warning("artifact %s counts as absent: %s (%s)", _shown(path), seen.message, seen.reason)
        return self.watch.observe(found)
