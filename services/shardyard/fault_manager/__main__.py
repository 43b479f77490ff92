"""``python -m shardyard.fault_manager``: load settings, build the app, run it."""

import sys

from shardyard.fault_manager.app import FaultSettings, build_app
from shardyard.service import run_main

if __name__ == "__main__":
    sys.exit(run_main(FaultSettings, build_app, prog="shardyard-fault-manager"))
