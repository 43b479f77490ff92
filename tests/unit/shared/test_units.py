from __future__ import annotations

import pytest

from shardyard.units import GIB, format_bytes, parse_bytes


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("64GiB", 64 * GIB, id="gib"),
        pytest.param("64 GiB", 64 * GIB, id="space-before-unit"),
        pytest.param("  64GiB  ", 64 * GIB, id="surrounding-space"),
        pytest.param("64gib", 64 * GIB, id="lower-case"),
        pytest.param("64Gi", 64 * GIB, id="gi-without-b"),
        pytest.param("32GB", 32 * 1000**3, id="decimal-gb"),
        pytest.param("32G", 32 * 1000**3, id="decimal-g"),
        pytest.param("512MiB", 512 * 1024**2, id="mib"),
        pytest.param("512MB", 512 * 1000**2, id="mb"),
        pytest.param("4KiB", 4096, id="kib"),
        pytest.param("1.5TiB", int(1.5 * 1024**4), id="fractional-tib"),
        pytest.param("2TB", 2 * 1000**4, id="tb"),
        pytest.param("100B", 100, id="bytes-unit"),
        pytest.param("100", 100, id="bare-number-string"),
        pytest.param(0, 0, id="int-zero"),
        pytest.param(68719476736, 64 * GIB, id="int-bytes"),
    ],
)
def test_parse_bytes(value: str | int, expected: int) -> None:
    assert parse_bytes(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("64 parsecs", "unknown unit", id="bad-unit"),
        pytest.param("64XB", "unknown unit", id="bad-prefix"),
        pytest.param(-1, "negative", id="negative-int"),
        pytest.param("-1GiB", "not a memory size", id="negative-string"),
        pytest.param(True, "number of bytes", id="bool"),
        pytest.param(False, "number of bytes", id="bool-false"),
        pytest.param("lots", "not a memory size", id="garbage"),
        pytest.param("", "not a memory size", id="empty"),
        pytest.param("GiB", "not a memory size", id="unit-only"),
        pytest.param("1e9", "not a memory size", id="exponent"),
        pytest.param("1.5.2GiB", "not a memory size", id="two-dots"),
    ],
)
def test_parse_bytes_refuses(value: str | int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_bytes(value)


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        pytest.param(0, "0B", id="zero"),
        pytest.param(1023, "1023B", id="below-kib"),
        pytest.param(1024, "1KiB", id="kib"),
        pytest.param(1536, "1.5KiB", id="fractional-kib"),
        pytest.param(512 * 1024**2, "512MiB", id="mib"),
        pytest.param(64 * GIB, "64GiB", id="gib"),
        pytest.param(int(1.5 * 1024**4), "1.5TiB", id="fractional-tib"),
        pytest.param(2048 * 1024**4, "2048TiB", id="beyond-tib"),
    ],
)
def test_format_bytes(count: int, expected: str) -> None:
    assert format_bytes(count) == expected


@pytest.mark.parametrize("text", ["64GiB", "512MiB", "1.5TiB", "4KiB", "100B"], ids=str)
def test_format_then_parse_round_trips(text: str) -> None:
    assert format_bytes(parse_bytes(text)) == text
