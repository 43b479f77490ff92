"""A broker that forgot its log: noticed by the processes that read it whole, and answered by starting over.

A consumer without a group that never seeks (a service's follower, the monitor's feed) reads each partition's
offsets in increasing order, always. An offset below one it has read means the log it read is gone: an embedded
broker keeps its log in memory and comes back empty from a restart (a real cluster that lost its data, or a topic
deleted and created again, looks the same). What the process built from the old log (jobs, leases, terms,
placements) then describes a cluster that no longer exists, and a new submission reusing an old job id would meet it.

(Comparing what was read with the partitions' end offsets would also tell a log that was lost and not written
to since. Tansu does not allow it: its end offset of a partition is the first offset of its last produce batch plus
one (18 records in three batches: 13), on a fresh broker too, and a service must not start over for that.
``shardyard up``'s supervisor, which restarts the broker, starts every other process over itself; see
``cli/supervisor.py``.)

Each follower's ``LogWatch`` calls the process's reaction once. ``run_main``'s, for every service, is
``stop_to_start_over``: the process stops as on SIGTERM and exits with ``EXIT_CODE`` (75, EX_TEMPFAIL). Its
supervisor (``shardyard up``, compose's ``restart``, systemd's ``Restart=on-failure``) starts it again, and it
rebuilds its state, the topics included, from the log that is there. Crash-only: the restart path is the one every
replica already takes. Elsewhere (a library user, a test's in-process service) it is logged.
"""

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from aiokafka import TopicPartition

log = logging.getLogger(__name__)

STOP_DEADLINE_S: Final = 60.0
"""How long the stop gets before the process exits anyway."""
EXIT_CODE: Final = 75
"""EX_TEMPFAIL: a service that read a log the broker forgot exits with it, to be started over."""

Reaction = Callable[[str], None]


def _log_only(why: str) -> None:
    log.error("%s", why)


_reaction: Reaction = _log_only
_stopping = False


def react_with(reaction: Reaction) -> None:
    """What this process does on news of a lost log (the default logs it)."""
    global _reaction
    _reaction = reaction


def react(why: str) -> None:
    _reaction(why)


def stop_to_start_over(why: str) -> None:
    """A service's reaction under ``run_main``: say why, and stop as on SIGTERM, to exit with ``EXIT_CODE``."""
    global _stopping
    if _stopping:
        return
    _stopping = True
    log.error("%s; stopping, to be started again on the log the broker has now (exit code %d)", why, EXIT_CODE)
    loop = asyncio.get_running_loop()
    timer = threading.Timer(STOP_DEADLINE_S, _stop_stuck, args=(loop,))
    timer.daemon = True
    timer.start()
    os.kill(os.getpid(), signal.SIGTERM)


def _stop_stuck(loop: asyncio.AbstractEventLoop) -> None:
    """The stop did not end in ``STOP_DEADLINE_S``: say where each task is, and exit."""
    tasks = asyncio.all_tasks(loop)
    log.error("not stopped %.0f s after the broker forgot its log; exiting (%d tasks)", STOP_DEADLINE_S, len(tasks))
    for task in tasks:
        with contextlib.suppress(Exception):
            log.error("task %s at %s", task.get_name(), task.get_stack(limit=8))
    logging.shutdown()
    os._exit(EXIT_CODE)


def exit_code(otherwise: int = 0) -> int:
    """What the process exits with: ``EXIT_CODE`` once it stopped to start over."""
    return EXIT_CODE if _stopping else otherwise


@dataclass
class LogWatch:
    """What one reader without a group has read, per partition; an offset that goes back is news of a lost log."""

    name: str
    read_to: dict[TopicPartition, int] = field(default_factory=dict)
    """Partition -> the offset after the last record read."""
    told: bool = False

    def read(self, tp: TopicPartition, offsets: Iterable[int]) -> None:
        """Records of ``tp`` were read, at ``offsets`` (in order)."""
        seen = self.read_to.get(tp, 0)
        for offset in offsets:
            if offset < seen and not self.told:
                self.told = True
                react(
                    f"the broker forgot the log this process read ({self.name} read {tp.topic}[{tp.partition}] to "
                    f"offset {seen}, then offset {offset}): it was restarted empty or lost its data"
                )
            seen = max(seen, offset + 1)
        self.read_to[tp] = seen
