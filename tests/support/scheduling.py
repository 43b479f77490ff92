"""How pytest-xdist shares the tests between its two workers (``./dev test`` runs them so).

- **One at a time, on one worker** (the ``serial`` unit of work): the tests that start a whole cluster and train on
  it, or judge its timing (``tests/chaos``, ``tests/e2e`` but for :data:`LIGHT_CLUSTERS`), and the integration
  modules that are load tests themselves (:data:`LOAD_TESTS`). They run in one process's order, as the whole suite did
  before it ran on two workers.
- **Module by module, on the other worker**: the unit and integration tests (each module's broker started once), and
  last the end-to-end modules whose clusters barely compute (:data:`LIGHT_CLUSTERS`: no training beyond a few steps,
  one process per service), as one more unit of work.

Why not more clusters at once: on two cores, two or three training clusters side by side starved each other's
heartbeats (agents self-fenced, healthy nodes were judged lost, jobs failed), and the run took longer than one
process. The unit and integration layers wait on their brokers far more than they compute, and fit beside one
cluster; so do the light clusters."""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling

SERIAL = "serial"
LIGHT = "light-clusters"
LIGHT_CLUSTERS = frozenset(
    f"tests/e2e/{name}.py"
    for name in (
        "test_cli_up",
        "test_dashboard",
        "test_progress_tmux",
        "test_artifact_wait",
        "test_cli_cluster",
        "test_shard_isolation",
        "test_logs_per_run",
        "test_user_entrypoint",
        "test_follow_views",
        "test_up_in_a_row",
    )
)
"""Chosen so that the two lanes end together: on a fresh clone here the serial lane ended 3 minutes before the other
while these included the accounting and observability end-to-end modules (about 100 s between them)."""
LOAD_TESTS = frozenset({"tests/integration/test_batch_consumers.py"})
"""Integration modules that heartbeat hundreds of simulated nodes from the test process itself: beside a training
cluster their own senders fall behind, and the pool rightly suspects the nodes they stand for."""


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to: :data:`SERIAL`, :data:`LIGHT`, or its module."""
    module = nodeid.split("::", 1)[0]
    if module in LIGHT_CLUSTERS:
        return LIGHT
    if module.startswith(("tests/e2e/", "tests/chaos/")) or module in LOAD_TESTS:
        return SERIAL
    return module


LANE_ORDER = ("tests/chaos/", "tests/e2e/", "tests/integration/", "tests/unit/")


def rank(nodeid: str) -> tuple[int, int]:
    """Where a test goes in the collection: the serial unit first (the longest chain starts at once; within it the
    chaos tests first, beside the unit and integration tests rather than beside the light clusters), then the
    modules, integration before unit, and the light clusters last (after them, on the worker that runs them)."""
    scope = scope_of(nodeid)
    place = next((i for i, prefix in enumerate(LANE_ORDER) if nodeid.startswith(prefix)), len(LANE_ORDER))
    return (0 if scope == SERIAL else 2 if scope == LIGHT else 1, place)


class TwoLaneScheduling(LoadScopeScheduling):
    """xdist's scope scheduling over :func:`scope_of`'s units, handed out in collection order (see :func:`rank`)."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # the order is rank's, not the units' sizes

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)
