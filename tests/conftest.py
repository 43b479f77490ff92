from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import real_broker


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    """A real Kafka-compatible broker for one test module (a fresh embedded broker, unless one is configured)."""
    with real_broker() as address:
        yield address


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs"
