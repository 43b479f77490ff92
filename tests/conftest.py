import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardyard.broker.kafka import JVM_OPTS_ENV
from shardyard.cli.claims import RENDEZVOUS_BASE_ENV
from tests.support.broker import real_broker
from tests.support.cluster import reachable_by_shards, shard_users_unavailable


def pytest_configure(config: pytest.Config) -> None:
    """Agents started by the tests run shards as users of their jobs' own where they can. Where other users cannot
    run this Python (a pyenv inside a 0700 /root), agents running as root would refuse to start: theirs then run
    as the agent (``SHARDYARD_SHARD_USER=agent``, unless set already), and the tests of isolation skip."""
    # `shardyard up` records the cluster it started as the user's default (~/.config/shardyard/run-dir): the tests'
    # clusters go to a folder of this session's, not to the home of whoever runs them.
    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="shardyard-tests-config-")
    # The tests start a few dozen Kafka brokers: each compiles with C1 only, starting on 1.7 CPU-seconds, not 2.8.
    os.environ.setdefault(JVM_OPTS_ENV, "-XX:TieredStopAtLevel=1")
    worker = xdist_worker()
    if worker is not None and RENDEZVOUS_BASE_ENV not in os.environ:
        # Workers' clusters run side by side: each worker's agents take rendezvous ports of their own.
        os.environ[RENDEZVOUS_BASE_ENV] = str(WORKER_PORT_BASE + worker * WORKER_PORT_SPAN)
    why = shard_users_unavailable()
    if os.geteuid() == 0 and why is not None and "SHARDYARD_SHARD_USER" not in os.environ:
        os.environ["SHARDYARD_SHARD_USER"] = "agent"
        warnings.warn(f"shards run as the agent in these tests: {why}", stacklevel=1)


WORKER_PORT_BASE = 20_000
WORKER_PORT_SPAN = 1_000
"""pytest-xdist worker N's agents take rendezvous ports from 20,000 + 1,000 N (below the kernel's ephemeral range):
up to 20 nodes of 50 ports each per worker, and no two workers' clusters share a port."""


def xdist_worker() -> int | None:
    """This process's pytest-xdist worker number (``gw3`` -> 3); None when the tests run in one process."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return int(worker.removeprefix("gw")) if worker else None


LAYERS = ("unit", "integration", "e2e", "chaos", "gpu")
"""The order the layers run in, in one process: the quick ones first, so a failure there shows at once, and the
timing-sensitive clusters of chaos and e2e after the CPU-bound lint and type-check that ``./dev test`` runs beside
the tests."""


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``-n N``: the two lanes of :mod:`tests.support.scheduling`, whatever ``--dist`` says."""
    from tests.support.scheduling import TwoLaneScheduling

    return TwoLaneScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the layers in ``LAYERS`` order; the order within one layer (module by module) stays as collected. Under
    xdist, in the lanes' order (``tests/support/scheduling.py``)."""

    def layer(item: pytest.Item) -> int:
        found = _layer_of(item)
        return LAYERS.index(found) if found in LAYERS else len(LAYERS)

    if parallel(config):
        from tests.support.scheduling import rank

        items.sort(key=lambda item: rank(item.nodeid))
    else:
        items.sort(key=layer)


def _layer_of(item: pytest.Item) -> str | None:
    parts = item.path.parts
    return next((part for part in LAYERS if part in parts[-3:-1]), None)


def parallel(config: pytest.Config) -> bool:
    """Whether pytest-xdist runs the tests in worker processes (``-n N``, N > 0), seen from the controller or a
    worker."""
    return xdist_worker() is not None or bool(getattr(config.option, "numprocesses", None))


@pytest.fixture(scope="session", autouse=True)
def _shards_pass_the_temporary_root(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Shards of agents running as root run as their jobs' users, and must pass through pytest's temporary root and
    this session's base (pytest makes both 0700): both get the search bit, nothing more. pytest takes it off the
    root again whenever a session starts, and this fixture of that session puts it back at once (in every root
    session, isolated or not: sessions run side by side); a session that does not load this file (another
    project's, as root) leaves it off, and shards of a cluster under it then self-fence (no lease file)."""
    if os.geteuid() == 0:
        reachable_by_shards(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    """A real broker for one test module: a fresh local Apache Kafka (or what ``tests.support.broker`` is told)."""
    with real_broker() as address:
        yield address


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs"
