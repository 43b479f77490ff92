"""``python -m shardyard.monitor``: load settings, build the app, run it."""

import sys

from shardyard.monitor.app import MonitorSettings, build_app
from shardyard.service import run_main

if __name__ == "__main__":
    sys.exit(run_main(MonitorSettings, build_app, prog="shardyard-monitor"))
