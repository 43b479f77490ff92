"""A process that reads one topic of heartbeats with ``Bus.subscribe_batch`` and writes the ``seq`` of every event it
handled to a file, one per line; with ``--die-at N`` it kills itself (``os._exit``, no clean-up, no commit) in the
middle of the batch that holds its N-th event.

    python -m tests.support.batch_consumer BOOTSTRAP TOPIC GROUP OUT [--die-at N] [--max-records M]
"""

import argparse
import asyncio
import os
from collections.abc import Sequence

from faststream import FastStream

from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.topics import Topic
from shardyard.events import Event, Heartbeat, HeartbeatEvent


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("group")
    parser.add_argument("out")
    parser.add_argument("--die-at", type=int, default=0)
    parser.add_argument("--max-records", type=int, default=500)
    args = parser.parse_args(argv)
    topic = Topic(args.topic, 1, "node id", HeartbeatEvent)
    broker = make_broker(args.bootstrap, client_id="batch-consumer")
    bus = Bus(broker, service="batch-consumer")
    handled = 0
    out = open(args.out, "a")  # noqa: SIM115, ASYNC230 - one small line per event, flushed before any death

    async def handle(events: Sequence[Heartbeat]) -> list[Event]:
        nonlocal handled
        for event in events:
            out.write(f"{event.seq}\n")
            out.flush()
            handled += 1
            if handled == args.die_at:
                os._exit(9)  # mid-batch: the batch's offsets are never committed
        return []

    bus.subscribe_batch({topic: handle}, group=args.group, max_records=args.max_records)
    await FastStream(broker).run()


if __name__ == "__main__":
    asyncio.run(main())
