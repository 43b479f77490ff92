"""``python -m shardyard.queue``: load settings, build the app, run it."""

import sys

from shardyard.queue.app import QueueSettings, build_app
from shardyard.service import run_main

if __name__ == "__main__":
    sys.exit(run_main(QueueSettings, build_app, prog="shardyard-queue"))
