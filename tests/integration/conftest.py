"""The integration modules that need a broker run on the local Apache Kafka, and then once more on the embedded
fallback (see ``tests.support.broker.integration_broker_kinds``): a module's tests run on one broker, then on the
other, ids ``[kafka]`` and ``[embedded]``."""

from collections.abc import Iterator

import pytest

from shardyard.bus.address import BROKER_ENV
from tests.support.broker import integration_broker_kinds, real_broker


@pytest.fixture(scope="module", params=integration_broker_kinds())
def broker_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """Which broker this module runs on; the processes its tests start are told (``bus.quirks``)."""
    kind: str = request.param
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(BROKER_ENV, kind)
        yield kind


@pytest.fixture(scope="module")
def bootstrap(broker_kind: str) -> Iterator[str]:
    """A fresh broker of ``broker_kind`` for one test module (or the outside one configured)."""
    with real_broker(None if broker_kind == "external" else broker_kind) as address:
        yield address
