"""Topic creation and broker readiness, through the Kafka admin protocol."""

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
)

from shardyard.bus.topics import CATALOGUE, Topic
from shardyard.bus.transport import client_options
from shardyard.errors import BrokerError

log = logging.getLogger(__name__)

NOT_AUTHORIZED = TopicAuthorizationFailedError.errno
READY_GROUP = "shardyard-admin-ready"
"""A group nobody joins: asking for its coordinator makes the broker create its offsets topic, once."""


async def ensure_topics(
    bootstrap: str,
    topics: Iterable[Topic] = CATALOGUE,
    *,
    timeout_s: float = 30.0,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Create every missing topic of ``topics`` with its configuration, put right the configuration of those that
    exist, and return once every partition has a leader and consumer groups have a coordinator; wait up to
    ``timeout_s`` for the broker to answer. ``environ``: the transport's settings (``bus.transport``; default this
    process's environment)."""
    deadline = time.monotonic() + timeout_s
    wanted = list(topics)
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="shardyard-admin", **client_options(environ))
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
            await _configure([t for t in wanted if t.name in existing], admin)
            await _led(wanted, admin, deadline)
            return
        except (KafkaConnectionError, KafkaError, OSError) as exc:
            if time.monotonic() > deadline:
                raise BrokerError(f"cannot create topics on {bootstrap}: {exc}") from exc
            await asyncio.sleep(0.2)
        finally:
            await admin.close()


async def _configure(topics: list[Topic], admin: AIOKafkaAdminClient) -> None:
    """Set each topic's catalogue configuration where the broker holds another (a topic created before its
    retention was set). The embedded broker (Tansu 0.6) answers neither call: its ``memory://`` log keeps
    everything whatever a topic says, so there is nothing to set there."""
    if not topics:
        return
    try:
        held = await _configs(admin, [t.name for t in topics])
    except KafkaError as exc:
        log.info("the broker does not describe topic configurations (%s): retention left as it is", exc)
        return
    stale = [t for t in topics if any(held.get(t.name, {}).get(k) != v for k, v in t.configs.items())]
    if not stale:
        return
    resources = [ConfigResource(ConfigResourceType.TOPIC, t.name, configs=t.configs) for t in stale]
    try:
        await admin.alter_configs(resources)
    except KafkaError as exc:
        log.warning("could not set the retention of %s: %s", [t.name for t in stale], exc)
        return
    log.info("set the catalogue's retention of %s", [t.name for t in stale])


async def _configs(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, dict[str, str]]:
    """Each topic's configuration as the broker holds it."""
    resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
    found: dict[str, dict[str, str]] = {}
    for response in await admin.describe_configs(resources):
        for resource in response.resources:
            error, name, entries = resource[0], resource[3], resource[4]
            if error:
                raise KafkaError(f"describing {name}: error {error}")
            found[name] = {entry[0]: entry[1] for entry in entries}
    return found


async def _led(topics: list[Topic], admin: AIOKafkaAdminClient, deadline: float) -> None:
    """Wait until every partition of ``topics`` has a leader and groups have a coordinator: Apache Kafka answers a
    new topic's first produce with NOT_LEADER and a first group with COORDINATOR_NOT_AVAILABLE for a moment (while
    it creates its offsets topic); every client retries, but each logs it, and a service's start waits on it."""
    while True:
        leaderless = _leaderless(await admin.describe_topics([t.name for t in topics]))
        coordinator = await _coordinator(admin)
        if not leaderless and coordinator:
            return
        if time.monotonic() > deadline:
            raise KafkaError(f"no leader yet for {leaderless[:5]}" if leaderless else "no group coordinator yet")
        await asyncio.sleep(0.1)


def _leaderless(described: list[Mapping[str, Any]]) -> list[str]:
    """The partitions without a leader yet, and the topics the broker could not describe. A topic this principal may
    not describe (a secured broker's ACLs: an agent reads a few topics only) is not its to wait for."""
    return [
        f"{topic['topic']}[{partition['partition']}]"
        for topic in described
        for partition in topic.get("partitions", [])
        if partition.get("leader", -1) < 0
    ] + [str(topic["topic"]) for topic in described if topic.get("error_code", 0) not in (0, NOT_AUTHORIZED)]


async def _coordinator(admin: AIOKafkaAdminClient) -> bool:
    try:
        await admin.find_coordinator(READY_GROUP)
    except GroupAuthorizationFailedError:
        return True  # a secured broker answers, but lets only the admin ask of a group not its own
    except KafkaError:
        return False
    return True
