"""``python -m shardyard.training.shard``: how the node agent starts a shard.

The lease watchdog (:mod:`shardyard.training.lease`) starts first, before the runner and torch are imported: an
import takes seconds on a loaded node, and a shard whose agent was paused meanwhile must not outlive its lease just
because it was still importing. Then the runner runs as ``python -m shardyard.training.runner`` would.
"""

import os
import sys

from shardyard.training.lease import start_watchdog


def main() -> int:
    start_watchdog(os.environ)
    from shardyard.training.runner import main as run

    return run(watch_lease=False)


if __name__ == "__main__":
    sys.exit(main())
