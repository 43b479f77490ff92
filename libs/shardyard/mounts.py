"""How a node maps the absolute paths jobs name (``/data/models/x``) onto its own disk: through the mounts its agent
declares (``--mounts /data=/srv/data``: job path prefix -> local directory), by whole path components, the longest
prefix winning. Pure.

The agent maps (and confines) the paths it looks at by this rule (``shardyard.node_agent.mounts``); the scheduler
reads it to say where a missing artifact is to be put on a node's disk.
"""

from collections.abc import Mapping
from pathlib import PurePosixPath


def host_path(job_path: str, mounts: Mapping[str, str]) -> str | None:
    """Where ``job_path`` lies on the disk of a node with ``mounts``: the longest mounted prefix replaced; the path
    as it is on a node without mounts (it serves its paths as they are); None when no mount holds it."""
    if not mounts:
        return job_path
    path = PurePosixPath(job_path)
    for prefix in sorted(mounts, key=len, reverse=True):
        root = PurePosixPath(prefix)
        if path == root or root in path.parents:
            return str(PurePosixPath(mounts[prefix]) / path.relative_to(root))
    return None
