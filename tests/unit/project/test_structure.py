"""The size rules of the production code (``libs``, ``services``): no file over 400 lines, no function over 60. Long
files and functions are where responsibilities pile up; the rule makes a new one split its parts out instead."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
SOURCES = sorted(path for top in ("libs", "services") for path in (ROOT / top).rglob("*.py"))


def test_the_sources_are_found() -> None:
    assert len(SOURCES) > 100


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_or_function_is_too_long(path: Path) -> None:
    source = path.read_text()
    assert source.count("\n") <= MAX_FILE_LINES, f"{path.name}: {source.count(chr(10))} lines"
    long = [
        f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []
