"""``python -m shardyard.node_agent``: load settings, build the app, run it."""

import sys

from shardyard.node_agent.app import AgentSettings, build_app
from shardyard.service import run_main

if __name__ == "__main__":
    sys.exit(run_main(AgentSettings, build_app, prog="shardyard-node-agent"))
