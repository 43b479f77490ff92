"""``python progress_driver.py FIFO``: the real progress bar of ``submit --wait``, drawn in the terminal this runs in
from job views read from ``FIFO`` (one JSON object a line, as ``/api/jobs/ID`` answers), one redraw each. At the end
of its input it ends the line and prints ``DONE``."""

import json
import sys

from shardyard.cli.progress import ProgressLine

DONE = "progress driver done"


def main(fifo: str) -> int:
    line = ProgressLine()
    with open(fifo, encoding="utf-8") as frames:
        for raw in frames:
            line.update(json.loads(raw))
    line.close()
    print(DONE, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
