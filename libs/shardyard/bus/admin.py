"""Topic creation and broker readiness, through the Kafka admin protocol."""

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAlreadyExistsError

from shardyard.bus.topics import CATALOGUE, Topic
from shardyard.bus.transport import client_options
from shardyard.errors import BrokerError

log = logging.getLogger(__name__)


async def ensure_topics(bootstrap: str, topics: Iterable[Topic] = CATALOGUE, *, timeout_s: float = 30.0) -> None:
    """Create every missing topic of ``topics``; wait up to ``timeout_s`` for the broker to answer."""
    deadline = time.monotonic() + timeout_s
    wanted = list(topics)
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="shardyard-admin", **client_options())
        try:
            await admin.start()
            existing = set(await admin.list_topics())
            missing = [t for t in wanted if t.name not in existing]
            if missing:
                # Another process may create one between list and create: that is fine.
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics(
                        [NewTopic(t.name, t.partitions, 1, topic_configs=t.configs) for t in missing]
                    )
                log.info("created topics %s", [t.name for t in missing])
            return
        except (KafkaConnectionError, KafkaError, OSError) as exc:
            if time.monotonic() > deadline:
                raise BrokerError(f"cannot create topics on {bootstrap}: {exc}") from exc
            await asyncio.sleep(0.2)
        finally:
            await admin.close()
