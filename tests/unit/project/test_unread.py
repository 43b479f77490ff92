"""A follower passes over the event types its service declares it never applies (``Follower.unread``): no file that
applies the followed facts may match or test for one of them, or a fact it needs would go unread."""

import ast
from pathlib import Path

import pytest

from shardyard import events
from shardyard.fault_manager.app import UNREAD as FAULT_UNREAD
from shardyard.resource_pool.app import UNREAD as POOL_UNREAD
from shardyard.scheduler.app import UNREAD as SCHEDULER_UNREAD

SERVICES = Path(__file__).parents[3] / "services" / "shardyard"
APPLYING = {
    "scheduler": (SCHEDULER_UNREAD, ["scheduler/facts.py", "scheduler/handlers.py", "scheduler/book.py"]),
    "resource-pool": (POOL_UNREAD, ["resource_pool/ledger.py", "resource_pool/handlers.py"]),
    "fault-manager": (FAULT_UNREAD, [f"fault_manager/{f.name}" for f in (SERVICES / "fault_manager").glob("*.py")]),
}
TYPES = {
    cls.model_fields["type"].default: name
    for name in events.__all__
    if isinstance(cls := getattr(events, name), type) and issubclass(cls, events.Event) and "type" in cls.model_fields
}


def _names(node: ast.AST) -> set[str]:
    """Class names in a case pattern or an isinstance's second argument."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def matched(source: str) -> set[str]:
    """The classes ``source`` matches on (``case Cls()``) or tests for (``isinstance(x, Cls)``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.match_case):
            found |= {
                n.cls.id
                for n in ast.walk(node.pattern)
                if isinstance(n, ast.MatchClass) and isinstance(n.cls, ast.Name)
            }
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            found |= _names(node.args[1])
    return found


@pytest.mark.parametrize("service", list(APPLYING))
def test_a_follower_passes_over_only_what_its_service_never_applies(service: str) -> None:
    unread, files = APPLYING[service]
    assert unread <= set(TYPES), f"not event types: {sorted(unread - set(TYPES))}"
    applied = set().union(*(matched((SERVICES / f).read_text()) for f in files))
    assert applied & {TYPES[t] for t in unread} == set()
    assert {"JobScheduled", "NodeState"} <= applied  # the check reads what it means to


def test_the_check_sees_matches_and_isinstance() -> None:
    source = "match e:\n    case JobAccepted() | JobReady():\n        pass\n"
    source += "if isinstance(e, JobFailed | JobCancelled) or isinstance(e, (NodeState,)):\n    pass\n"

    assert matched(source) == {"JobAccepted", "JobReady", "JobFailed", "JobCancelled", "NodeState"}
