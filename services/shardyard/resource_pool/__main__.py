"""``python -m shardyard.resource_pool``: load settings, build the app, run it."""

import sys

from shardyard.resource_pool.app import PoolSettings, build_app
from shardyard.service import run_main

if __name__ == "__main__":
    sys.exit(run_main(PoolSettings, build_app, prog="shardyard-resource-pool"))
