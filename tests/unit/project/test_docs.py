"""The documentation's shape, checked without building it (`./dev check` and `./dev test` also run `mkdocs build
--strict`, which checks the links): a short README that names the test command, a nav that lists every page of docs/
and only pages that exist, and an event-flow picture that shows every topic of the catalogue."""

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardyard.bus.topics import CATALOGUE

ROOT = Path(__file__).parents[3]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MKDOCS = ROOT / "mkdocs.yml"
ARCHITECTURE = DOCS / "architecture" / "index.md"
README_MAX_LINES = 300
TEST_COMMAND = "./dev test"
CI_COMMAND = "./dev test --all"
"""CI runs the test command the README names (`.ci/run`), with every test, the slow ones too."""


class _ConfigLoader(yaml.SafeLoader):
    """mkdocs.yml as data: its `!!python/name:` tags (a Markdown extension's formatter) read as None."""


_ConfigLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def nav_pages(nav: Any) -> list[str]:
    """Every page a MkDocs nav names, in order: entries are `page.md`, `{title: page.md}` or `{title: [entries]}`."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for entry in nav for page in nav_pages(entry)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    raise AssertionError(f"a nav entry mkdocs.yml cannot hold: {nav!r}")


def readme_problems(text: str) -> list[str]:
    """What is wrong with a README's text: too long, or missing the test command."""
    problems = []
    lines = len(text.splitlines())
    if lines > README_MAX_LINES:
        problems.append(f"README.md has {lines} lines, over {README_MAX_LINES}: move the detail to a page of docs/")
    if TEST_COMMAND not in text:
        problems.append(f"README.md does not name the test command {TEST_COMMAND!r} (CI runs it)")
    return problems


def mermaid_blocks(text: str) -> list[str]:
    return re.findall(r"^```mermaid\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


NAV = nav_pages(yaml.load(MKDOCS.read_text(), Loader=_ConfigLoader)["nav"])


def test_the_readme_is_short_and_names_the_test_command() -> None:
    assert readme_problems(README.read_text()) == []


def test_ci_runs_the_command_the_readme_names_for_every_test() -> None:
    assert CI_COMMAND in README.read_text()
    assert CI_COMMAND in (ROOT / ".ci" / "run").read_text()


def test_a_readme_over_the_limit_or_without_the_test_command_is_refused() -> None:
    fine = "\n".join([f"Run `{TEST_COMMAND}`."] + ["line"] * (README_MAX_LINES - 1))
    assert readme_problems(fine) == []
    assert len(readme_problems(fine + "\none line too many")) == 1
    assert len(readme_problems(fine.replace(TEST_COMMAND, "pytest"))) == 1


def test_every_page_in_the_nav_exists() -> None:
    missing = [page for page in NAV if not (DOCS / page).is_file()]
    assert missing == [], f"mkdocs.yml's nav names pages docs/ does not hold: {missing}"
    assert len(NAV) == len(set(NAV)), "a page is in the nav twice"


def test_every_page_of_docs_is_in_the_nav() -> None:
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    assert sorted(pages - set(NAV)) == [], "pages of docs/ that mkdocs.yml's nav leaves out"


@pytest.mark.parametrize("topic", [topic.name for topic in CATALOGUE])
def test_the_event_flow_picture_shows_every_topic(topic: str) -> None:
    pictures = mermaid_blocks(ARCHITECTURE.read_text())
    assert pictures, f"{ARCHITECTURE.relative_to(ROOT)} has no Mermaid picture of the event flow"
    assert any(topic in picture for picture in pictures), f"the event flow picture leaves out {topic}"


def test_the_readme_links_only_to_pages_that_exist() -> None:
    linked = re.findall(r"\]\((docs/[^)#\s]+\.md)(?:#[^)]*)?\)", README.read_text())
    assert linked, "the README links to no page of docs/"
    assert [link for link in linked if not (ROOT / link).is_file()] == []
