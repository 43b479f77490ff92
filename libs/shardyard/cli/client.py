"""Talking to a running cluster: producing submissions and commands to Kafka, reading state from the monitor's
status API, and reading the shard logs the agents write."""

from __future__ import annotations

import getpass
import json
import os
import re
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardyard.cli.cluster_info import get_json
from shardyard.errors import BrokerError, ClusterError, NeverFits

# asyncio and the tracing (OpenTelemetry) are imported where used, as these are: a command that only reads the
# monitor loads none of them, nor pydantic, nor aiokafka (tests/unit/cli/test_cli_show.py holds it to that).
if TYPE_CHECKING:
    from shardyard.admission import Refused
    from shardyard.events import Event, JobCancelRequested, NodeDrain

TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"})
CLI_SERVICE = "shardyard-cli"


@dataclass(frozen=True)
class Submitted:
    job_id: str
    partition: int
    offset: int


DOCUMENT_REASONS = frozenset(
    {
        "MALFORMED_JSON",
        "NOT_AN_OBJECT",
        "MISSING_FIELD",
        "WRONG_TYPE",
        "UNKNOWN_FIELD",
        "INVALID_VALUE",
        "SHARD_COUNT_MISMATCH",
        "TOO_LARGE",
        "TOO_DEEP",
        "TOO_MANY_FIELDS",
    }
)
"""The rejections a document earns by itself, whatever the cluster's settings (its GPU catalogue, path prefixes and
allowed environment are the operator's, so ``check`` leaves those to the queue)."""


def check(raw: bytes) -> Refused | None:
    """How the queue's own admission code (``shardyard.admission``) would reject these bytes for what they are, or
    None when only the cluster can tell."""
    from shardyard.admission import ANY_PATH, Refused, admit, named_job
    from shardyard.gpus import catalogue_with

    verdict = admit(raw, catalogue=catalogue_with([]), submitted_at=datetime.now(UTC), fallback_id="-", policy=ANY_PATH)
    if isinstance(verdict, Refused) and verdict.reason.value in DOCUMENT_REASONS:
        return replace(verdict, job_id=job_id_of(raw, -1, -1) if named_job(raw) else "(no task_id)")
    return None


def job_id_of(raw: bytes, partition: int, offset: int) -> str:
    """The id the queue will give this submission: the ``task_id`` its bytes name (``named_job``, as the queue reads
    it), or ``invalid-P-O`` when they name none (``submit`` keys a submission by that same id)."""
    from shardyard.admission import named_job

    return named_job(raw) or f"invalid-{partition}-{offset}"


async def _produce(
    bootstrap: str, raw: bytes, headers: list[tuple[str, bytes]] | None = None, *, job_id: str | None = None
) -> Submitted:
    from aiokafka import AIOKafkaProducer

    from shardyard.admission import named_job
    from shardyard.bus.topics import SUBMISSIONS
    from shardyard.bus.transport import client_options

    named = job_id or named_job(raw)
    key = named.encode() if named else None

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, **client_options())
    await producer.start()
    try:
        meta = await producer.send_and_wait(SUBMISSIONS.name, raw, key=key, headers=headers or None)
    finally:
        await producer.stop()
    return Submitted(job_id_of(raw, meta.partition, meta.offset), meta.partition, meta.offset)


def with_owner(raw: bytes, owner: str | None) -> bytes:
    """The submission with ``owner`` filled in where it names none (absent or null); any other bytes as they are
    (one that names an owner, or one that is not a JSON object, which the queue answers for itself)."""
    if owner is None:
        return raw
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        return raw
    if not isinstance(document, dict) or document.get("owner") is not None:
        return raw
    return json.dumps({**document, "owner": owner}).encode()


CREDENTIALS_ENV = "SHARDYARD_CREDENTIALS"
"""The credentials file ``submit`` signs with (``--credentials``), as the queue's ``--credentials-file``."""


def _document(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return {}


def queue_of(raw: bytes) -> str:
    """The queue a submission names (``default`` when none): its team's."""
    document = _document(raw)
    queue = document.get("queue") if isinstance(document, dict) else None
    return queue if isinstance(queue, str) and queue else "default"


def _team_key(document: Any, credentials_file: str) -> tuple[str, str, str]:
    """The team the document's queue names (``default`` when none), and its key to sign with: (team, id, secret)."""
    from shardyard.signing import CredentialsError, read_credentials

    queue = document.get("queue") if isinstance(document, dict) else None
    team = queue if isinstance(queue, str) and queue else "default"
    credentials = read_credentials(Path(credentials_file))
    if team not in credentials.teams:
        raise CredentialsError(f"{credentials_file} holds no key of team {team!r} (the job's queue)")
    return (team, *credentials.key(team))


def signature(raw: bytes, credentials_file: str) -> list[tuple[str, bytes]]:
    """The headers that sign ``raw`` with the key of the team its queue names (``default`` when none)."""
    from shardyard.signing import sign

    team, key_id, secret = _team_key(_document(raw), credentials_file)
    return sign(raw, team=team, key_id=key_id, secret=secret, now_s=time.time())


def sealed_submission(raw: bytes, credentials_file: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    """``raw`` as ``shardyard submit --credentials`` sends it: its entrypoint's environment values encrypted to the
    queue under the team's key (``shardyard.secret_env``), then signed (``signature``)."""
    from shardyard import secret_env

    document = _document(raw)
    entrypoint = document.get("entrypoint") if isinstance(document, dict) else None
    env = entrypoint.get("env") if isinstance(entrypoint, dict) else None
    job_id = document.get("task_id") if isinstance(document, dict) else None
    strings = isinstance(env, dict) and bool(env) and all(isinstance(v, str) for v in env.values())
    if isinstance(entrypoint, dict) and isinstance(env, dict) and strings and isinstance(job_id, str):
        team, key_id, secret = _team_key(document, credentials_file)
        sealer = secret_env.team_sealer(team, key_id)
        entrypoint["env"] = secret_env.encrypt_all(env, secret_env.team_key(secret), job_id, sealer=sealer)
        raw = json.dumps(document).encode()
    return raw, signature(raw, credentials_file)


def submit(bootstrap: str, raw: bytes, signed: Sequence[tuple[str, bytes]] = ()) -> Submitted:
    """Produce a submission, with the ``signed`` headers (``signature``). It starts the job's trace: its
    ``traceparent`` header makes everything the cluster does for the job (admission to the shards' last sync) one
    trace, exported when the ``OTEL_*`` variables ask for it."""
    import asyncio

    from shardyard import tracing
    from shardyard.bus.topics import SUBMISSIONS

    tracing.configure(CLI_SERVICE, os.environ)
    with tracing.span("submit", {"messaging.destination.name": SUBMISSIONS.name}) as span:
        headers = [*tracing.to_headers(tracing.carrier_of(span)), *signed]
        submitted = asyncio.run(_produce(bootstrap, raw, headers))
        span.set_attribute(tracing.JOB_ID, submitted.job_id)
    return submitted


async def _publish(bootstrap: str, event: Event) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    from shardyard.bus.codec import encode, key_of, topic_of
    from shardyard.bus.seal import ADMIN, for_component

    topic, body, key = topic_of(event).name, encode(event), key_of(event)
    seal = for_component(ADMIN, _operator())  # an operator's command, sealed where the cluster has a secret
    headers = None if seal is None else [(n, v.encode()) for n, v in seal.headers(topic, key, body).items()]
    from shardyard.bus.transport import client_options

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, **client_options())
    try:
        await producer.start()
        try:
            await producer.send_and_wait(topic, body, key=key, headers=headers)
        finally:
            await producer.stop()
    except KafkaError as exc:
        raise BrokerError(f"cannot publish {type(event).__name__} to the broker at {bootstrap}: {exc}") from exc


def publish(bootstrap: str, event: Event) -> None:
    """Produce one event to its topic under its key, as any service would."""
    import asyncio

    asyncio.run(_publish(bootstrap, event))


def request_cancel(bootstrap: str, job_id: str, *, requested_by: str) -> JobCancelRequested:
    from shardyard.events import JobCancelRequested

    request = JobCancelRequested(occurred_at=datetime.now(UTC), job_id=job_id, requested_by=requested_by)
    publish(bootstrap, request)
    return request


def request_team_cancel(bootstrap: str, job_id: str, queue: str, credentials_file: str) -> Submitted:
    """A team's cancel of its own job: ``{"cancel": JOB, "queue": QUEUE}`` on the submissions topic, keyed by the
    job, signed with the key of ``queue``'s team (the queue checks both: ``shardyard.queue.team_cancel``)."""
    import asyncio

    raw = json.dumps({"cancel": job_id, "queue": queue}).encode()
    return asyncio.run(_produce(bootstrap, raw, signature(raw, credentials_file), job_id=job_id))


def request_drain(bootstrap: str, node_id: str, *, draining: bool) -> NodeDrain:
    from shardyard.events import NodeDrain

    request = NodeDrain(occurred_at=datetime.now(UTC), node_id=node_id, draining=draining)
    publish(bootstrap, request)
    return request


def job(monitor_url: str, job_id: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = get_json(f"{monitor_url}/api/jobs/{urllib.parse.quote(job_id)}")
        return found
    except OSError as exc:  # an HTTPError (a URLError, an OSError) carries the monitor's status
        code = getattr(exc, "code", None)
        if code == 404:
            return None
        if code is not None:
            raise ClusterError(f"the monitor answered {code} for job {job_id}") from exc
        raise ClusterError(f"cannot reach the monitor at {monitor_url}: {exc}") from exc


def listing(monitor_url: str, what: str) -> dict[str, Any]:
    try:
        result: dict[str, Any] = get_json(f"{monitor_url}/api/{what}")
        return result
    except OSError as exc:  # URLError and HTTPError included
        raise ClusterError(f"cannot reach the monitor at {monitor_url}: {exc}") from exc


def links(monitor_url: str) -> dict[str, Any]:
    """The monitor's measured links (``/api/links``): the live nodes, and their links worst first."""
    try:
        return listing(monitor_url, "links")
    except ClusterError as exc:
        if getattr(exc.__cause__, "code", None) == 404:  # an HTTPError
            raise ClusterError(f"the monitor at {monitor_url} serves no measured links (an older version)") from exc
        raise


def node(monitor_url: str, node_id: str) -> dict[str, Any] | None:
    """The monitor's view of one node, or None when it has never reported."""
    found: dict[str, Any] | None = next(
        (n for n in listing(monitor_url, "nodes")["nodes"] if n["node_id"] == node_id), None
    )
    return found


def wait(
    monitor_url: str,
    job_id: str,
    *,
    timeout_s: float,
    on_update: Callable[[dict[str, Any]], None],
    poll_s: float = 0.25,
    never_fits_s: float | None = None,
) -> dict[str, Any]:
    """Follow a job until it reaches a terminal state; ``on_update`` sees its view at every poll (a follower keeps
    time even when nothing changes). With ``never_fits_s``, give up (``NeverFits``) once the job has waited
    ``NEVER_FITS`` that long without a break."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] | None = None
    never_since: float | None = None
    while time.monotonic() < deadline:
        current = job(monitor_url, job_id)
        if current is not None:
            on_update(current)
            last = current
            if current["state"] in TERMINAL_STATES:
                return current
            never = current.get("reason") == "NEVER_FITS"
            never_since = (never_since or time.monotonic()) if never else None
            if never_since is not None and never_fits_s is not None and time.monotonic() - never_since >= never_fits_s:
                raise NeverFits(job_id, str(current.get("message") or ""), time.monotonic() - never_since)
        time.sleep(poll_s)
    raise ClusterError(f"job {job_id} did not finish within {timeout_s:.0f}s (last state: {last and last['state']})")


def wait_node(
    monitor_url: str, node_id: str, *, draining: bool, timeout_s: float, poll_s: float = 0.25
) -> dict[str, Any]:
    """Wait until the monitor shows ``node_id`` with the drain mark ``draining``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        current = node(monitor_url, node_id)
        if current is not None and current.get("draining") is draining:
            return current
        time.sleep(poll_s)
    want = "draining" if draining else "undrained"
    raise ClusterError(f"node {node_id} was not shown {want} within {timeout_s:.0f}s")


# --- shard logs ---------------------------------------------------------------------------------------------------
LOG_NAME = re.compile(r"^shard-(\d+)-attempt-(\d+)\.log$")
"""How agents name a shard's log under ``<log-dir>/<job>/`` (``--log-dir``; for ``up``, one per cluster run:
``rundir.SHARD_LOGS/RUN_ID``)."""


@dataclass(frozen=True)
class ShardLog:
    shard: int
    attempt: int
    path: Path


def shard_logs(log_dir: Path, job_id: str, *, shard: int | None = None, attempt: int | None = None) -> list[ShardLog]:
    """The job's shard logs by shard index: each shard's newest attempt, or the attempt named."""
    newest: dict[int, ShardLog] = {}
    folder = log_dir / job_id
    for path in sorted(folder.iterdir()) if folder.is_dir() else ():
        match = LOG_NAME.match(path.name)
        if match is None:
            continue
        log = ShardLog(int(match[1]), int(match[2]), path)
        if (shard is not None and log.shard != shard) or (attempt is not None and log.attempt != attempt):
            continue
        if log.shard not in newest or log.attempt > newest[log.shard].attempt:
            newest[log.shard] = log
    return [newest[index] for index in sorted(newest)]


class LogTail:
    """Reads a job's shard logs as they grow. Each ``poll`` returns the whole lines written since the last one. When
    a shard's newer attempt appears (a gang re-formed after a failure) the older log's last lines come first, then
    the newer one is followed."""

    def __init__(self, log_dir: Path, job_id: str, *, shard: int | None = None, attempt: int | None = None) -> None:
        self.log_dir, self.job_id, self.shard, self.attempt = log_dir, job_id, shard, attempt
        self.offsets: dict[Path, int] = {}
        self.current: dict[int, ShardLog] = {}

    def poll(self, *, final: bool = False) -> list[tuple[ShardLog, str]]:
        """New lines of every followed log; ``final`` also returns a last line not ended yet."""
        out: list[tuple[ShardLog, str]] = []
        for log in shard_logs(self.log_dir, self.job_id, shard=self.shard, attempt=self.attempt):
            previous = self.current.get(log.shard)
            if previous is not None and previous != log:
                out.extend(self._read(previous, final=True))  # that attempt is over: all of it
            self.current[log.shard] = log
            out.extend(self._read(log, final=final))
        return out

    def _read(self, log: ShardLog, *, final: bool) -> list[tuple[ShardLog, str]]:
        offset = self.offsets.get(log.path, 0)
        try:
            with log.path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
        except OSError:
            return []  # removed meanwhile: nothing to show
        taken = data if final else data[: data.rfind(b"\n") + 1]
        self.offsets[log.path] = offset + len(taken)
        return [(log, line) for line in taken.decode(errors="replace").splitlines()]


def _operator() -> str:
    """Who runs this command, for the seal's component name."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no user name in the environment or the password database
        return "operator"
