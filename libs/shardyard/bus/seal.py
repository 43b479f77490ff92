"""Sealed events between components: who published an event, proven, and whether that one may publish it.

With a cluster secret configured (a file named by ``SHARDYARD_CLUSTER_SECRET_FILE``, readable by its owner only),
every service replica, agent and operator command seals what it publishes on the internal topics, and every consumer
checks the seal before it applies an event. Without one nothing is sealed or checked (as before).

- **Keys.** A component's key is derived from the cluster secret for its role and name:
  ``HMAC-SHA256(secret, "shardyard-seal-v1" role component)``, role and component each length-prefixed. Roles:
  each service's name (``scheduler``, ``queue``, ``resource-pool``, ``fault-manager``, ``monitor``,
  ``accounting``), ``node-agent`` (the component is the node id) and ``admin`` (an operator's command).
- **The seal.** Two headers: ``x-shardyard-from: ROLE/COMPONENT`` and ``x-shardyard-seal``, the hex HMAC-SHA256
  under that component's key over the topic, the record key and the body, each length-prefixed, and the from header.
  A consumer derives the claimed component's key and compares in constant time.
- **Who may publish what** (``permitted``): an agent only heartbeats, leases, shard events and link measurements
  of its own node (the event's ``node_id`` is the sealing node), and its own announcement; an operator only cancel
  requests and drains; a leadership claim or a service announcement only for the sealing service's own name; a
  service anything else.

A consumer refuses an event that is unsealed (``UNSEALED``), whose seal does not verify (``BAD_SEAL``), or whose
sealer may not publish it (``NOT_PERMITTED``): it is dead-lettered with the reason (``x-shardyard-forged``), counted
in ``shardyard_events_rejected_total{topic,reason}`` and not applied; the monitor counts the cluster's dead letters
of forged events and fires ``FORGED_EVENTS``.

What it does not do: every component holds the cluster secret (as every Slurm node holds the MUNGE key), so a
compromised agent host can derive any key; a sealed event has no nonce (a recorded genuine event replayed is applied
again, and every consumer is idempotent on event ids and states); submissions carry the teams' own signatures
(``shardyard.signing``), not a seal.
"""

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

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
AGENT = "node-agent"
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


SERVICE_ROLES = frozenset({"scheduler", "queue", "resource-pool", "fault-manager", "monitor", "accounting"})


class Refusal(StrEnum):
    UNSEALED = "UNSEALED"
    BAD_SEAL = "BAD_SEAL"
    NOT_PERMITTED = "NOT_PERMITTED"


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


def _mac(key: bytes, topic: str, record_key: bytes | None, body: bytes, sealer: str) -> str:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in (topic.encode(), record_key or b"", body, sealer.encode()):
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)
    return mac.hexdigest()


@dataclass
class Seal:
    """One component's sealing and checking: ``headers`` for what it publishes, ``check`` and ``permitted`` for what
    it consumes."""

    keys: Keys
    role: str
    component: str

    @property
    def sealer(self) -> str:
        return f"{self.role}/{self.component}"

    def headers(self, topic: str, record_key: bytes | None, body: bytes) -> dict[str, str]:
        sealer = self.sealer
        return {FROM_HEADER: sealer, SEAL_HEADER: _mac(self.keys.of(sealer), topic, record_key, body, sealer)}

    def check(
        self, topic: str, record_key: bytes | None, body: bytes, headers: Iterable[tuple[str, bytes]] | None
    ) -> tuple[str, Refusal | None]:
        """(the sealer, None) for a record whose seal verifies; else (what it claimed, why it is refused)."""
        found = {name: value for name, value in headers or () if name in (FROM_HEADER, SEAL_HEADER)}
        sealer_raw, seal_raw = found.get(FROM_HEADER), found.get(SEAL_HEADER)
        if not sealer_raw or not seal_raw:
            return "", Refusal.UNSEALED
        sealer = sealer_raw.decode(errors="replace")
        if "/" not in sealer or len(sealer) > 300:
            return sealer[:300], Refusal.BAD_SEAL
        expected = _mac(self.keys.of(sealer), topic, record_key, body, sealer)
        if not hmac.compare_digest(expected.encode(), seal_raw):
            return sealer, Refusal.BAD_SEAL
        return sealer, None


def permitted(sealer: str, event: Event) -> bool:
    """Whether ``sealer`` (``ROLE/COMPONENT``, verified) may publish ``event`` (see the module's doc)."""
    role, _, component = sealer.partition("/")
    if role == AGENT:
        if isinstance(event, ServiceReady):  # an agent announces itself: as the node it is
            return event.service == AGENT and event.instance == component
        return isinstance(event, AGENT_EVENTS) and getattr(event, "node_id", None) == component
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
) -> Refusal | None:
    """Why ``event``, decoded from a record of ``topic``, must not be applied (counted in
    ``shardyard_events_rejected_total``); None when it may, or nothing is checked here (no ``seal``)."""
    if seal is None:
        return None
    sealer, why = seal.check(topic, record_key, body, headers)
    if why is None and not permitted(sealer, event):
        why = Refusal.NOT_PERMITTED
    if why is not None:
        metrics.EVENTS_REJECTED.labels(topic, why.value).inc()
    return why


def refused(why: Refusal, topic: str, headers: Iterable[tuple[str, bytes]] | None) -> str:
    """The dead letter's error for a refused event: the reason and who it claimed to be."""
    claimed = next((v.decode(errors="replace") for k, v in headers or () if k == FROM_HEADER), "nobody")
    return f"forged event refused ({why.value}): on {topic}, sealed by {claimed[:300]!r}"
