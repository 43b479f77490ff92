"""One exception tree: every error the training runtime raises on purpose is a ShardyardError, and the ones that were
ValueErrors (caught as such) still are."""

from __future__ import annotations

import pytest

from shardyard import errors
from shardyard.training.config import ConfigError
from shardyard.training.data import DatasetError
from shardyard.training.entry import UsageError
from shardyard.training.errors import CommError, DeviceError, SyncTimeoutError, UserError
from shardyard.training.model import CheckpointError
from shardyard.training.standby import OrderError

TRAINING_ERRORS = [UserError, DeviceError, CommError, SyncTimeoutError, CheckpointError]
VALUE_ERRORS = [ConfigError, DatasetError, UsageError, OrderError]


@pytest.mark.parametrize("error", [*TRAINING_ERRORS, *VALUE_ERRORS], ids=lambda error: error.__name__)
def test_a_training_error_is_a_shardyard_error(error: type[Exception]) -> None:
    assert issubclass(error, errors.ShardyardError)


@pytest.mark.parametrize("error", VALUE_ERRORS, ids=lambda error: error.__name__)
def test_a_training_error_that_was_a_value_error_still_is(error: type[Exception]) -> None:
    assert issubclass(error, ValueError)


def test_a_shard_configuration_error_is_a_configuration_error() -> None:
    problem = ConfigError(["SHARDYARD_MAX_STEPS is not a number"])

    assert isinstance(problem, errors.ConfigError)
    assert str(problem) == "invalid shard configuration: SHARDYARD_MAX_STEPS is not a number"


def test_a_sync_timeout_is_a_communication_error() -> None:
    assert issubclass(SyncTimeoutError, CommError)
