"""What a job waiting for its model or dataset (``WAITING_FOR_ARTIFACT``) is missing, where, and how to provide it:
the lines ``shardyard status JOB`` prints for the monitor's ``missing_artifacts``."""

from typing import Any

from shardyard.cli.demo_data import EXAMPLE_PATHS


def _nodes(missing: dict[str, Any]) -> str:
    named = list(missing.get("nodes") or [])
    more = missing.get("lacking", len(named)) - len(named)
    text = ", ".join(named) + (f" and {more} more" if more > 0 else "")
    if missing.get("lacking") == missing.get("of_nodes"):
        return f"every node it could use ({text})"
    return f"{missing.get('lacking')} of the {missing.get('of_nodes')} nodes it could use ({text})"


def _where(missing: dict[str, Any]) -> list[str]:
    """Where to put it: each host path with the named nodes that mount the job path there."""
    by_host: dict[str, list[str]] = {}
    for node, host in (missing.get("host_paths") or {}).items():
        by_host.setdefault(host, []).append(node)
    if not by_host:
        return ["      no mount of those nodes holds this path: their agents never look for it"]
    return [f"      put it at {host} on {', '.join(nodes)}" for host, nodes in sorted(by_host.items())]


def artifact_hint(job: dict[str, Any]) -> list[str]:
    """The missing paths, the nodes lacking each and where to put it, then how to make the example's data; none
    when the job waits for no artifact."""
    missing: list[dict[str, Any]] = job.get("missing_artifacts") or []
    if not missing:
        return []
    lines = ["    missing (the job starts once a node it could use has each of them):"]
    for artifact in missing:
        lines.append(f"    - {artifact['path']}: absent on {_nodes(artifact)}")
        lines.extend(_where(artifact))
    lines.append("    put the files there, under the nodes' mount (agents run with --mounts /data=HOST_DIR): the job")
    lines.append("    starts within seconds of their agents seeing them")
    if any(artifact["path"] in EXAMPLE_PATHS for artifact in missing):
        lines.append("    the example job's data: `shardyard up --demo-data` makes it before the agents start (after")
        lines.append("    `shardyard down`), or `shardyard demo`")
    return lines
