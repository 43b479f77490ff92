"""``python -m shardyard.monitor``: fit the cycle collector to the monitor, load settings, build the app, run it."""

import sys

from shardyard.monitor.app import MonitorSettings, build_app, tune_collector
from shardyard.service import run_main

if __name__ == "__main__":
    tune_collector()
    sys.exit(run_main(MonitorSettings, build_app, prog="shardyard-monitor"))
