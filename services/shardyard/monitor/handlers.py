"""Monitor handlers: every event folds into the cluster view."""

from collections.abc import Awaitable, Callable

from faststream.kafka import KafkaMessage
from prometheus_client import Counter

from shardyard.bus.topics import Topic
from shardyard.monitor.views import ClusterView


class MonitorHandlers:
    def __init__(self, view: ClusterView, events: Counter) -> None:
        self.view = view
        self.events = events

    def for_topic(self, topic: Topic) -> Callable[[object], Awaitable[None]]:
        async def on_event(event: object) -> None:
            self.view.apply(event)
            self.events.labels(topic.name).inc()  # counted once folded: a failing attempt is not a consumed event

        return on_event

    async def on_dead_letter(self, _raw: bytes, _message: KafkaMessage) -> None:
        self.view.dead_letters += 1
