"""``python -m shardyard.accounting``: load settings, build the app, run it."""

import sys

from shardyard.accounting.app import AccountingSettings, build_app
from shardyard.service import run_main

if __name__ == "__main__":
    sys.exit(run_main(AccountingSettings, build_app, prog="shardyard-accounting"))
