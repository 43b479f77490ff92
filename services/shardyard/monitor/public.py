"""What the status API and the dashboard may show of a job's spec."""

from typing import Any

REDACTED = "<redacted>"


def public_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as the status API and the dashboard show it: an entrypoint's environment keeps its names, but its
    values (tokens, keys, passwords as often as not) stay between the bus and the agents."""
    entrypoint = spec.get("entrypoint")
    if not isinstance(entrypoint, dict) or not entrypoint.get("env"):
        return spec
    return {**spec, "entrypoint": {**entrypoint, "env": dict.fromkeys(entrypoint["env"], REDACTED)}}
