"""Parsing of human-readable quantities used in job submissions ("64GiB", "512MB")."""

import re

_UNITS: dict[str, int] = {
    "": 1,
    "B": 1,
    "K": 1000,
    "KB": 1000,
    "M": 1000**2,
    "MB": 1000**2,
    "G": 1000**3,
    "GB": 1000**3,
    "T": 1000**4,
    "TB": 1000**4,
    "KI": 1024,
    "KIB": 1024,
    "MI": 1024**2,
    "MIB": 1024**2,
    "GI": 1024**3,
    "GIB": 1024**3,
    "TI": 1024**4,
    "TIB": 1024**4,
}
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")

GIB = 1024**3


def parse_bytes(value: str | int) -> int:
    """Return the byte count of ``value``: an int (bytes) or a string like ``"64GiB"``, ``"1.5 TB"``, ``"512Mi"``.

    Raises ValueError with a message naming the accepted units.
    """
    if isinstance(value, bool):
        raise ValueError("a memory size must be a number of bytes or a string like '64GiB'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a memory size cannot be negative")
        return value
    match = _QUANTITY.match(value)
    if match is None:
        raise ValueError(f"{value!r} is not a memory size; write it like '64GiB', '512MiB' or '32GB'")
    number, unit = match.groups()
    factor = _UNITS.get(unit.upper())
    if factor is None:
        raise ValueError(f"unknown unit {unit!r} in {value!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB")
    return int(float(number) * factor)


def format_bytes(count: int) -> str:
    """Render a byte count with a binary unit, e.g. ``68719476736 -> '64GiB'``."""
    for unit, factor in (("TiB", 1024**4), ("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if count >= factor:
            value = count / factor
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{count}B"
