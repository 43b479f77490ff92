"""``python -m shardyard.scheduler``: load settings, build the app, run it."""

import sys

from shardyard.scheduler.app import SchedulerSettings, build_app
from shardyard.service import run_main

if __name__ == "__main__":
    sys.exit(run_main(SchedulerSettings, build_app, prog="shardyard-scheduler"))
