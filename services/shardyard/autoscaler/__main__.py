"""``python -m shardyard.autoscaler``: load settings, build the app, run it."""

import sys

from shardyard.autoscaler.app import AutoscalerSettings, build_app
from shardyard.service import run_main

if __name__ == "__main__":
    sys.exit(run_main(AutoscalerSettings, build_app, prog="shardyard-autoscaler"))
