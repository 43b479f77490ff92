"""The import rules of the code base, checked on the source (parsed with ``ast``, nothing imported):

- a library (``libs/``) imports no service;
- a service imports no other service (shared code lives in ``libs/``);
- no import cycles among the modules of ``libs/`` and ``services/``, nor among their packages (``shardyard.sim``,
  ``shardyard.cli``, ... each counted as one, a module directly under ``shardyard`` as one of its own): a library
  that imports another imports all of it, so the two cannot depend on each other either way.

Every import counts: at module level, inside functions, and under ``if TYPE_CHECKING:``. An import names the most
specific module of ours it reaches (``from shardyard.events import JobSpec`` reaches ``shardyard.events``;
``from shardyard.bus import kafka`` reaches ``shardyard.bus.kafka``); the parent packages Python initialises on the
way are not counted as imports of their own.
"""

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]
LIBS = ROOT / "libs"
SERVICES = ROOT / "services"
SERVICE_PACKAGES = frozenset(
    f"shardyard.{path.name}" for path in (SERVICES / "shardyard").iterdir() if (path / "__init__.py").is_file()
)


@dataclass(frozen=True)
class Import:
    source: Path
    line: int
    importer: str
    """The importing module, dotted."""
    target: str
    """The module of ours it reaches (or the dotted name it asked for, when that is not ours)."""
    text: str
    """The import statement as written."""

    def __str__(self) -> str:
        return f"{self.source.relative_to(ROOT)}:{self.line}: {self.text}"


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {
    module_name(path, base): path for base in (LIBS, SERVICES) for path in sorted(base.rglob("*.py"))
}


def service_of(module: str) -> str | None:
    """The service package ``module`` belongs to, if any."""
    for package in SERVICE_PACKAGES:
        if module == package or module.startswith(package + "."):
            return package
    return None


def reached(name: str) -> str:
    """The most specific module of ours ``name`` (dotted) falls in; ``name`` itself when none."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return name


def imports_of(module: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(path, node.lineno, module, reached(alias.name), ast.unparse(node))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                yield Import(path, node.lineno, module, reached(f"{base}.{alias.name}"), ast.unparse(node))


IMPORTS: list[Import] = list(
    dict.fromkeys(found for module, path in MODULES.items() for found in imports_of(module, path))
)
"""Every import of ours and theirs, once per statement and module reached."""


def test_the_service_packages_are_found() -> None:
    assert "shardyard.scheduler" in SERVICE_PACKAGES
    assert "shardyard.monitor" in SERVICE_PACKAGES
    assert not any(service_of(module) for module, path in MODULES.items() if path.is_relative_to(LIBS))


def test_libraries_import_no_service() -> None:
    offending = [str(found) for found in IMPORTS if found.source.is_relative_to(LIBS) and service_of(found.target)]
    assert not offending, "a library imports a service:\n" + "\n".join(offending)


def test_services_import_no_other_service() -> None:
    offending = [
        f"{found} (a {service_of(found.importer)} module imports {service_of(found.target)})"
        for found in IMPORTS
        if found.source.is_relative_to(SERVICES) and service_of(found.target) not in (None, service_of(found.importer))
    ]
    assert not offending, "a service imports another service:\n" + "\n".join(offending)


def cycles(edges: dict[str, dict[str, Import]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself), by Tarjan."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep import chain cannot exhaust the recursion limit.
        work = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(edges.get(target, {})))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in edges.get(node, {}):
                        found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def package_of(module: str) -> str:
    """The unit of the package-level check: ``shardyard.sim.report`` -> ``shardyard.sim``; ``shardyard.clock`` stays."""
    return ".".join(module.split(".")[:2])


def described_cycles(edges: dict[str, dict[str, Import]]) -> list[str]:
    described = []
    for component in cycles(edges):
        members = set(component)
        lines = [
            f"  {found}"
            for module in component
            for target, found in sorted(edges.get(module, {}).items())
            if target in members
        ]
        described.append("cycle among " + ", ".join(component) + ":\n" + "\n".join(lines))
    return described


def test_no_import_cycles_between_modules() -> None:
    edges: dict[str, dict[str, Import]] = {}
    for found in IMPORTS:
        if found.target in MODULES:
            edges.setdefault(found.importer, {}).setdefault(found.target, found)
    described = described_cycles(edges)
    assert not described, "import cycles between modules:\n" + "\n".join(described)


def test_no_import_cycles_between_packages() -> None:
    edges: dict[str, dict[str, Import]] = {}
    for found in IMPORTS:
        importer, target = package_of(found.importer), package_of(found.target)
        if found.target in MODULES and importer != target:
            edges.setdefault(importer, {}).setdefault(target, found)
    described = described_cycles(edges)
    assert not described, "import cycles between packages:\n" + "\n".join(described)


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"a"}}, [["a"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ],
    ids=["chain", "pair", "self", "triangle-with-tail"],
)
def test_cycles_finds_strongly_connected_modules(edges: dict[str, set[str]], expected: list[list[str]]) -> None:
    probe = Import(ROOT, 0, "", "", "")
    assert cycles({module: dict.fromkeys(targets, probe) for module, targets in edges.items()}) == expected
