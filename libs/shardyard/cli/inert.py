"""Job-supplied text made inert for a terminal: control characters (ESC, CR, backspace, DEL, the C1 controls and
the bidirectional overrides) shown as escapes, so a job's fields cannot move the cursor, recolour, retitle or
rewrite what ``shardyard`` prints. Newlines and tabs are kept (tracebacks stay readable)."""

import re
from typing import Any

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def inert(text: str) -> str:
    return _CONTROL.sub(_escape, text)


def inert_json(value: Any) -> Any:
    """``value`` (decoded JSON) with every string, keys too, made inert."""
    if isinstance(value, str):
        return inert(value)
    if isinstance(value, list):
        return [inert_json(item) for item in value]
    if isinstance(value, dict):
        return {inert(key) if isinstance(key, str) else key: inert_json(item) for key, item in value.items()}
    return value
