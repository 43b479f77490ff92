"""Who may submit: the queue's check of a submission's signature against the credentials (``shardyard.signing``).

A cluster with a credentials file takes a submission signed by a team's key, not revoked, within its time to live,
never seen before, for that team's own queue; and an unsigned one only into the queue the file names for anonymous
submissions. Anything else is refused with a typed reason (``UNAUTHENTICATED``, ``FORBIDDEN``, ``REPLAYED``) and
nothing else happens. Without a credentials file every submission is taken, as before."""

from collections.abc import Sequence
from dataclasses import dataclass

from shardyard.events import RejectReason
from shardyard.signing import Credentials, Refused, ReplayCache, Signed, verify


@dataclass(frozen=True)
class Denied:
    reason: RejectReason
    message: str


class Gate:
    def __init__(self, credentials: Credentials | None) -> None:
        self.credentials = credentials
        self.replays = ReplayCache()

    def check(self, raw: bytes, headers: Sequence[tuple[str, bytes]] | None, now_s: float) -> Signed | Denied | None:
        """Before the submission is read: its good signature, why it is refused, or None (unsigned, or no
        credentials: the queue it names decides, ``admits``)."""
        if self.credentials is None:
            return None
        found = verify(raw, headers, self.credentials, now_s)
        if isinstance(found, Refused):
            return Denied(RejectReason(found.reason.value), found.message)
        if found is not None and not self.replays.first_use(found.nonce, found.expires_s, now_s):
            return Denied(RejectReason.REPLAYED, f"this signature (key {found.key_id} of {found.team}) was used before")
        return found

    def admits(self, signed: Signed | None, queue: str) -> Denied | None:
        """Whether the submission may go into ``queue``, signed as ``signed`` (None: unsigned)."""
        if self.credentials is None:
            return None
        if signed is not None:
            if signed.team == queue:
                return None
            return Denied(RejectReason.FORBIDDEN, f"team {signed.team} may not submit to queue {queue!r}")
        anonymous = self.credentials.anonymous_queue
        if anonymous is not None and queue == anonymous:
            return None
        where = f"only into queue {anonymous!r}" if anonymous else "not at all"
        return Denied(RejectReason.UNAUTHENTICATED, f"unsigned submissions are taken {where}: sign it")
