"""``python -m shardyard.resource_pool``: load settings, build the app, run it."""

import os
import sys
from collections.abc import Sequence

from faststream import FastStream

from shardyard.clock import SystemClock
from shardyard.resource_pool.app import PoolSettings, build_app
from shardyard.service import configure_logging, run_main
from shardyard.settings import load_settings


def build(argv: Sequence[str]) -> FastStream:
    settings = load_settings(PoolSettings, argv, os.environ, prog="shardyard-resource-pool")
    configure_logging(settings.log_level)
    return build_app(settings, clock=SystemClock())


if __name__ == "__main__":
    sys.exit(run_main(build))
