"""Sealed events between components: who published an event, proven, and whether that one may publish it.

With a cluster secret configured (a file named by ``SHARDYARD_CLUSTER_SECRET_FILE``, readable by its owner only),
every service replica, agent and operator command seals what it publishes on the internal topics, and every consumer
checks the seal before it applies an event. Without one nothing is sealed or checked (as before).

- **Keys.** A component's key is derived from the cluster secret for its role and name:
  ``HMAC-SHA256(secret, "shardyard-seal-v1" role component)``, role and component each length-prefixed. Roles:
  each service's name (``scheduler``, ``queue``, ``resource-pool``, ``fault-manager``, ``monitor``,
  ``accounting``, ``autoscaler``), ``node-agent`` (the component is the node id), ``node-relay`` (a relay that
  publishes many nodes' leases in one record; the component is the relay's name) and ``admin`` (an operator's
  command).
- **The seal.** Two headers: ``x-shardyard-from: ROLE/COMPONENT`` and ``x-shardyard-seal``, the hex HMAC-SHA256
  under that component's key over the topic, the record key and the body, each length-prefixed, and the from header.
  A consumer derives the claimed component's key and compares in constant time.
- **Who may publish what** (``permitted``): an agent only heartbeats, leases, shard events and link measurements
  of its own node (the event's ``node_id`` is the sealing node), and its own announcement; a relay only batches of
  leases under its own name (``NodeLeases``: a relay is trusted for the nodes it relays, as an agent host is for
  its node); an operator only cancel requests and drains; a leadership claim or a service announcement only for the
  sealing service's own name; a service anything else.

A consumer refuses an event that is unsealed (``UNSEALED``), whose seal does not verify (``BAD_SEAL``), or whose
sealer may not publish it (``NOT_PERMITTED``): it is dead-lettered with the reason (``x-shardyard-forged``), counted
in ``shardyard_events_rejected_total{topic,reason}`` and not applied; the monitor counts the cluster's dead letters
of forged events and fires ``FORGED_EVENTS``.

**Good once, within a bounded time** (as MUNGE's credentials are: a time to live and a replay cache). The seal covers
``x-shardyard-sealed-at``, the sealing's time (ms). A consumer refuses as ``REPLAYED`` a record whose broker append
time is more than :data:`FRESH_S` from its sealing: a genuine record reaches the log within seconds of being sealed,
a recorded one played back reaches it later. On Apache Kafka the internal topics stamp each record with the broker's
own clock (``message.timestamp.type=LogAppendTime``, in the catalogue), so no client can choose it. Within that time:
beats carry a strictly increasing number per agent (the pool believes each once), an operator's command is believed
once per event id (its nonce: :class:`Replays`, kept long past ``FRESH_S``), and every other consumer is idempotent
on event ids, attempts and terms. A refused replay is dead-lettered like a forged event, with ``REPLAYED``. A
consumer that resumes from committed offsets (the resource pool's heartbeats) first reads back the last ``FRESH_S``
of its topic into that memory (:func:`remember`), so a restart does not make a captured command or beat new again.

What it does not do: every component holds the cluster secret (as every Slurm node holds the MUNGE key), so a
compromised agent host can derive any key; on the embedded broker (Tansu) a record's timestamp is the producer's, so
a crafted client can give a replay its original time (a stock client's replay is still refused, and beats and
commands are still believed once); a record sealed before the sealing time was carried (no ``sealed-at``) is
checked for its seal only; submissions carry the teams' own signatures (``shardyard.signing``), not a seal.
"""

import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, Protocol

from shardyard import metrics
from shardyard.cluster_secret import secret_from_env
from shardyard.events import (
    Event,
    Heartbeat,
    JobCancelRequested,
    LeaderElected,
    LeadershipClaimed,
    LinkMeasured,
    NodeDrain,
    NodeLease,
    NodeLeases,
    ServiceReady,
    ShardCheckpointed,
    ShardCompleted,
    ShardFailed,
    ShardPreempted,
    ShardProgress,
    ShardStarted,
)

FROM_HEADER = "x-shardyard-from"
SEAL_HEADER = "x-shardyard-seal"
FORGED_HEADER = "x-shardyard-forged"
SEALED_AT_HEADER = "x-shardyard-sealed-at"
FRESH_S: Final = 60.0
"""The most a record's broker append time may differ from its sealing: a producer's retries and the clocks' skew
fit in it with room; a replay played back later does not."""
ADMIN_MEMORY: Final = 100_000
"""Operators' commands whose event ids a consumer keeps (:class:`Replays`): far more than a cluster issues in a day."""
AGENT = "node-agent"
RELAY = "node-relay"
ADMIN = "admin"
_DOMAIN = b"shardyard-seal-v1"
_MAX_KEYS = 65_536
"""Derived keys kept per process: one per component seen, so a flood of made-up names costs a bounded cache."""

AGENT_EVENTS: tuple[type[Event], ...] = (
    Heartbeat,
    NodeLease,
    LinkMeasured,
    ShardStarted,
    ShardProgress,
    ShardCompleted,
    ShardFailed,
    ShardCheckpointed,
    ShardPreempted,
)
"""What an agent may publish, each about its own node only."""
ADMIN_EVENTS: tuple[type[Event], ...] = (JobCancelRequested, NodeDrain)
OWN_SERVICE_EVENTS: tuple[type[Event], ...] = (LeadershipClaimed, LeaderElected, ServiceReady)
"""Events a service may publish only under its own name (their ``service`` field)."""


SERVICE_ROLES = frozenset(
    {"scheduler", "queue", "resource-pool", "fault-manager", "monitor", "accounting", "autoscaler"}
)


class Refusal(StrEnum):
    UNSEALED = "UNSEALED"
    BAD_SEAL = "BAD_SEAL"
    NOT_PERMITTED = "NOT_PERMITTED"
    REPLAYED = "REPLAYED"
    """Genuine, but played back: appended too long after its sealing, or a command already believed."""


@dataclass
class Keys:
    """Component keys derived from one cluster secret, cached."""

    secret: bytes = field(repr=False)
    _cache: dict[str, bytes] = field(default_factory=dict, repr=False)

    def of(self, sealer: str) -> bytes:
        """The key of ``sealer`` (``ROLE/COMPONENT``)."""
        key = self._cache.get(sealer)
        if key is None:
            role, _, component = sealer.partition("/")
            material = _DOMAIN + b"".join(
                len(part).to_bytes(4, "big") + part for part in (role.encode(), component.encode())
            )
            key = hmac.new(self.secret, material, hashlib.sha256).digest()
            if len(self._cache) < _MAX_KEYS:
                self._cache[sealer] = key
        return key


def _mac(key: bytes, topic: str, record_key: bytes | None, body: bytes, sealer: str, sealed_at: bytes | None) -> str:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    parts = [topic.encode(), record_key or b"", body, sealer.encode()]
    if sealed_at is not None:  # a record sealed before the time was carried has none
        parts.append(sealed_at)
    for part in parts:
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)
    return mac.hexdigest()


@dataclass
class Replays:
    """What a consumer has believed of the records that must be believed once: operators' commands by event id,
    agents' beats by number, each with where it lies in the log. The same command (or an older beat) appended after
    the one believed is a replay; at its own offset it is the same record read again (a rebalance, a second reader
    in this process)."""

    limit: int = ADMIN_MEMORY
    _seen: "OrderedDict[str, tuple[str, int, int]]" = field(default_factory=OrderedDict)
    _beats: dict[str, tuple[str, int, tuple[str, int, int]]] = field(default_factory=dict)
    """By node: its agent instance, the newest beat number read and where that beat lies."""

    def beat(self, node_id: str, instance: str, seq: int, where: tuple[str, int, int]) -> bool:
        """Whether an agent's beat read at ``where`` is believed: not if a newer beat of the same agent instance lies
        before it in the same partition (it was appended after that one: played back). Read again at its own place
        (a rebalance, a second reader), it is."""
        known = self._beats.get(node_id)
        if known is None or known[0] != instance or seq > known[1]:
            self._beats[node_id] = (instance, seq, where)
            return True
        _instance, _newest, at = known
        return not (at[:2] == where[:2] and where[2] > at[2])

    def first(self, event_id: str, where: tuple[str, int, int]) -> bool:
        """Whether the command ``event_id`` read at ``where`` (topic, partition, offset) is believed."""
        known = self._seen.get(event_id)
        if known is not None and known[:2] == where[:2] and where[2] > known[2]:
            return False  # appended after the one believed: played back
        if known is not None and known[:2] == where[:2] and where[2] == known[2]:
            return True
        self._seen[event_id] = where
        if len(self._seen) > self.limit:
            self._seen.popitem(last=False)
        return True


@dataclass
class Seal:
    """One component's sealing and checking: ``headers`` for what it publishes, ``check`` and ``permitted`` for what
    it consumes."""

    keys: Keys
    role: str
    component: str
    replays: Replays = field(default_factory=Replays)
    """The operators' commands this process's consumers believed (``screen``)."""

    @property
    def sealer(self) -> str:
        return f"{self.role}/{self.component}"

    def headers(
        self, topic: str, record_key: bytes | None, body: bytes, sealed_at_ms: int | None = None
    ) -> dict[str, str]:
        """The seal of a record sealed now (or at ``sealed_at_ms``)."""
        sealer = self.sealer
        at = str(int(time.time() * 1000) if sealed_at_ms is None else sealed_at_ms)
        mac = _mac(self.keys.of(sealer), topic, record_key, body, sealer, at.encode())
        return {FROM_HEADER: sealer, SEAL_HEADER: mac, SEALED_AT_HEADER: at}

    def check(
        self, topic: str, record_key: bytes | None, body: bytes, headers: Iterable[tuple[str, bytes]] | None
    ) -> tuple[str, Refusal | None]:
        """(the sealer, None) for a record whose seal verifies; else (what it claimed, why it is refused)."""
        sealer, _at, why = self.verify(topic, record_key, body, headers)
        return sealer, why

    def verify(
        self, topic: str, record_key: bytes | None, body: bytes, headers: Iterable[tuple[str, bytes]] | None
    ) -> tuple[str, int | None, Refusal | None]:
        """``check``, with the sealing's time (ms; None for a record sealed before it was carried)."""
        wanted = (FROM_HEADER, SEAL_HEADER, SEALED_AT_HEADER)
        found = {name: value for name, value in headers or () if name in wanted}
        sealer_raw, seal_raw, at_raw = found.get(FROM_HEADER), found.get(SEAL_HEADER), found.get(SEALED_AT_HEADER)
        if not sealer_raw or not seal_raw:
            return "", None, Refusal.UNSEALED
        sealer = sealer_raw.decode(errors="replace")
        if "/" not in sealer or len(sealer) > 300:
            return sealer[:300], None, Refusal.BAD_SEAL
        expected = _mac(self.keys.of(sealer), topic, record_key, body, sealer, at_raw)
        if not hmac.compare_digest(expected.encode(), seal_raw):
            return sealer, None, Refusal.BAD_SEAL
        try:
            return sealer, None if at_raw is None else int(at_raw), None
        except ValueError:  # sealed, yet no time: only a holder of the key could have made it so
            return sealer, None, Refusal.BAD_SEAL


def permitted(sealer: str, event: Event) -> bool:
    """Whether ``sealer`` (``ROLE/COMPONENT``, verified) may publish ``event`` (see the module's doc)."""
    role, _, component = sealer.partition("/")
    if role == AGENT:
        if isinstance(event, ServiceReady):  # an agent announces itself: as the node it is
            return event.service == AGENT and event.instance == component
        return isinstance(event, AGENT_EVENTS) and getattr(event, "node_id", None) == component
    if role == RELAY:
        return isinstance(event, NodeLeases) and event.relay == component
    if role == ADMIN:
        return isinstance(event, ADMIN_EVENTS)
    if isinstance(event, OWN_SERVICE_EVENTS):
        return getattr(event, "service", None) == role
    return role in SERVICE_ROLES


def for_component(role: str, component: str, environ: Mapping[str, str] | None = None) -> Seal | None:
    """The seal of a component from the environment's cluster secret; None where none is configured."""
    secret = secret_from_env(environ)
    return None if secret is None else Seal(Keys(secret), role, component)


def checker(environ: Mapping[str, str] | None = None) -> Seal | None:
    """A seal that only checks (a follower, a replay): None where no cluster secret is configured."""
    return for_component("", "", environ)


def screen(
    seal: Seal | None,
    topic: str,
    record_key: bytes | None,
    body: bytes,
    headers: Iterable[tuple[str, bytes]] | None,
    event: Event,
    *,
    appended_ms: int | None = None,
    where: tuple[int, int] | None = None,
) -> Refusal | None:
    """Why ``event``, decoded from a record of ``topic``, must not be applied (counted in
    ``shardyard_events_rejected_total``); None when it may, or nothing is checked here (no ``seal``).
    ``appended_ms``: the record's timestamp (its freshness is judged); ``where``: its partition and offset (an
    operator's command is believed once)."""
    if seal is None:
        return None
    sealer, sealed_at, why = seal.verify(topic, record_key, body, headers)
    if why is None and not permitted(sealer, event):
        why = Refusal.NOT_PERMITTED
    stamped = sealed_at is not None and appended_ms is not None and appended_ms > 0
    if why is None and stamped and abs((appended_ms or 0) - (sealed_at or 0)) > FRESH_S * 1000:
        why = Refusal.REPLAYED
    if why is None and where is not None and not _believed(seal.replays, sealer, event, (topic, *where)):
        why = Refusal.REPLAYED
    if why is not None:
        metrics.EVENTS_REJECTED.labels(topic, why.value).inc()
    return why


class Read(Protocol):
    """A record as read (an aiokafka ``ConsumerRecord``)."""

    key: bytes | None
    headers: Sequence[tuple[str, bytes]]
    timestamp: int
    partition: int
    offset: int


def screen_read(seal: Seal | None, topic: str, record: Read, body: bytes, event: Event) -> Refusal | None:
    """``screen`` of a record as read: its seal, its freshness (its timestamp) and its place in the log."""
    return screen(
        seal,
        topic,
        record.key,
        body,
        record.headers,
        event,
        appended_ms=record.timestamp,
        where=(record.partition, record.offset),
    )


def believed_once(sealer: str) -> bool:
    """Whether what ``sealer`` publishes may be believed once only (:func:`_believed`): an agent's beats, an
    operator's commands. A consumer's memory of them is taught again after a restart
    (``bus.replay.remember_recent``)."""
    return sealer.startswith((AGENT + "/", ADMIN + "/"))


def remember(seal: Seal, topic: str, record: Read, body: bytes, event: Event) -> bool:
    """Teach ``seal``'s replay memory a record read before this process's consumers resume (as if they had
    believed it): a fresh, sealed, permitted beat or command. Nothing is counted or refused here; whether it was
    remembered is returned."""
    sealer, sealed_at, why = seal.verify(topic, record.key, body, record.headers)
    if why is not None or not believed_once(sealer) or not permitted(sealer, event):
        return False
    if sealed_at is not None and record.timestamp > 0 and abs(record.timestamp - sealed_at) > FRESH_S * 1000:
        return False  # refused by its time whenever it is read: nothing to remember
    where = (topic, record.partition, record.offset)
    _believed(seal.replays, sealer, event, where)
    return True


def _believed(replays: Replays, sealer: str, event: Event, where: tuple[str, int, int]) -> bool:
    """Whether a fresh record is read for the first time (an agent's beat, an operator's command) or again."""
    if isinstance(event, Heartbeat | NodeLease) and sealer.startswith(AGENT + "/"):
        return replays.beat(event.node_id, event.agent_instance, event.seq, where)
    if sealer.startswith(ADMIN + "/"):
        return replays.first(event.event_id, where)
    return True


def refused(why: Refusal, topic: str, headers: Iterable[tuple[str, bytes]] | None) -> str:
    """The dead letter's error for a refused event: the reason and who it claimed to be."""
    claimed = next((v.decode(errors="replace") for k, v in headers or () if k == FROM_HEADER), "nobody")
    if why is Refusal.REPLAYED:
        return f"replayed event refused (REPLAYED): on {topic}, sealed by {claimed[:300]!r}"
    return f"forged event refused ({why.value}): on {topic}, sealed by {claimed[:300]!r}"
