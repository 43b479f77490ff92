"""Who may submit: the queue's check of a submission's signature against the credentials (``shardyard.signing``).

A cluster with a credentials file takes a submission signed by a team's key, not revoked, within its time to live,
never seen before, for that team's own queue; and an unsigned one only into the queue the file names for anonymous
submissions. Anything else is refused with a typed reason (``UNAUTHENTICATED``, ``FORBIDDEN``, ``REPLAYED``) and
nothing else happens. Without a credentials file every submission is taken, as before."""

from collections.abc import Sequence
from dataclasses import dataclass

from shardyard import secret_env
from shardyard.events import JobSpec, RejectReason
from shardyard.signing import Credentials, Refused, ReplayCache, Signed, verify

ENV_VALUE_MAX = 65_536
"""The longest environment value an event carries (``events.job.EnvValue``), encrypted or not."""


@dataclass(frozen=True)
class Denied:
    reason: RejectReason
    message: str


class Gate:
    def __init__(self, credentials: Credentials | None, env_key: bytes | None = None) -> None:
        self.credentials = credentials
        self.replays = ReplayCache()
        self.env_key = env_key
        """The agents' key (``secret_env.agents_key`` of the cluster secret): None, the values travel as they came."""

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
            return Denied(
                RejectReason.FORBIDDEN,
                f"team {signed.team} may not submit to queue {queue!r}: sign with a key of team {queue!r}, or submit "
                f"to queue {signed.team!r}",
            )
        anonymous = self.credentials.anonymous_queue
        if anonymous is not None and queue == anonymous:
            return None
        into = f"; or submit it unsigned to queue {anonymous!r}" if anonymous else ""
        where = f"only into queue {anonymous!r}" if anonymous else "not at all"
        return Denied(
            RejectReason.UNAUTHENTICATED,
            f"unsigned submissions are taken {where}: sign it with a key of team {queue!r} (`shardyard submit "
            f"--credentials FILE`; a local cluster's keys are in RUN_DIR/credentials.yaml, which submit uses by "
            f"itself; another Kafka client adds the signature headers the security docs describe){into}",
        )

    def env_for_agents(self, spec: JobSpec, signed: Signed | None) -> JobSpec | Denied:
        """``spec`` with its entrypoint's environment values as the agents get them (``shardyard.secret_env``):
        each one encrypted to the queue by the signing team decrypted with that team's key, then every value
        encrypted to the agents (where the cluster has a secret). A value encrypted by another team, or that does not
        decrypt, refuses the submission."""
        entrypoint = spec.entrypoint
        if entrypoint is None or not entrypoint.env:
            return spec
        opened: dict[str, str] = {}
        for name, value in entrypoint.env.items():
            if not secret_env.encrypted(value):
                opened[name] = value
                continue
            found = self._team_secret(secret_env.sealer_of(value), signed)
            if isinstance(found, Denied):
                return Denied(found.reason, f"entrypoint.env {name}: {found.message}")
            try:
                opened[name] = secret_env.decrypt(secret_env.team_key(found), spec.job_id, name, value)
            except secret_env.SecretEnvError as exc:
                return Denied(RejectReason.INVALID_VALUE, f"entrypoint.env {exc}")
        env = opened
        if self.env_key is not None:
            env = secret_env.encrypt_all(opened, self.env_key, spec.job_id, sealer=secret_env.AGENTS)
        too_long = [name for name, value in env.items() if len(value) > ENV_VALUE_MAX]
        if too_long:
            return Denied(RejectReason.INVALID_VALUE, f"entrypoint.env {too_long[0]}: too long once encrypted")
        return spec.model_copy(update={"entrypoint": entrypoint.model_copy(update={"env": env})})

    def _team_secret(self, sealer: str, signed: Signed | None) -> str | Denied:
        """The secret of the key a value says it was encrypted with, where the submission is signed by that team."""
        kind, _, rest = sealer.partition("/")
        team, _, key_id = rest.partition("/")
        if kind != "team" or signed is None or team != signed.team or self.credentials is None:
            signer = f"signed by team {signed.team}" if signed is not None else "unsigned"
            return Denied(RejectReason.UNAUTHENTICATED, f"encrypted by {sealer or '?'}, but the submission is {signer}")
        key = self.credentials.teams[team].keys.get(key_id)
        if key is None:
            return Denied(RejectReason.UNAUTHENTICATED, f"encrypted with key {key_id!r}, which team {team} has not")
        return key.secret
