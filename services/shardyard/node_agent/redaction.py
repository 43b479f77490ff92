"""A job's secrets kept out of the text the agent publishes about its shards, pure.

A failed shard's message quotes the tail of its log (:func:`.launcher.tail`), and what a script prints there may be
its own tokens (a stack trace with a request's headers, a ``print(os.environ)``). The message travels the bus to the
monitor's API and dashboard, which other users read. So before any shard text leaves the agent, every value of the
job's ``entrypoint.env`` that is :data:`MIN_LENGTH` characters or longer is replaced with :data:`MASK`, and so is
every non-empty value whose name looks secret (:data:`SECRET_NAME`), however short: ``DEBUG=1`` is not worth hiding
(and hiding ``1`` would mangle every number), ``API_KEY=abc`` is.

Where secrets overlap in the text (one value inside another, or one's end the other's start), the union of their
spans becomes one mask: nothing of either is left showing. A multi-line value (a PEM key) is also hidden line by
line, since a log tail quotes lines, not the value whole.
"""

import re
from collections.abc import Iterable, Mapping
from typing import Final

MASK: Final = "***"
MIN_LENGTH: Final = 4
SECRET_NAME: Final = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)


def secrets_of(env: Mapping[str, str]) -> tuple[str, ...]:
    """The strings of ``env`` to hide, longest first: long values, any value of a secret-looking name, and the
    lines of each such multi-line value."""
    found: set[str] = set()
    for name, value in env.items():
        shortest = 1 if SECRET_NAME.search(name) else MIN_LENGTH
        parts = {value, *(line.strip() for line in value.splitlines())}
        found.update(part for part in parts if len(part) >= shortest and part.strip())
    return tuple(sorted(found, key=lambda s: (-len(s), s)))


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret, and of overlapping ones together, replaced by :data:`MASK`."""
    spans: list[tuple[int, int]] = []
    for secret in secrets:
        if not secret:
            continue
        at = text.find(secret)
        while at >= 0:
            spans.append((at, at + len(secret)))
            at = text.find(secret, at + 1)
    if not spans:
        return text
    spans.sort()
    merged = [spans[0]]
    for start, end in spans[1:]:
        last_start, last_end = merged[-1]
        if start <= last_end:
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    out: list[str] = []
    shown = 0
    for start, end in merged:
        out.append(text[shown:start])
        out.append(MASK)
        shown = end
    out.append(text[shown:])
    return "".join(out)
