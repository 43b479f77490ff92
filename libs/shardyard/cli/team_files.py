"""The files ``shardyard up`` hands the services: the queues file (the queue and the scheduler read it, again on each
change, and publish it), the credentials file (the queue verifies submissions with it; ``up`` makes a local one
unless ``--insecure``) and the cluster secret every process seals its events with (``shardyard.bus.seal``); and the
options of ``up`` and ``demo`` that say how open the cluster is and which broker it runs on."""

import argparse
import contextlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from shardyard.cluster_secret import SECRET_ENV, read_secret, write_secret
from shardyard.errors import ClusterError, ConfigError

QUEUES_FILE_TO = ("queue", "scheduler")
CREDENTIALS_FILE_TO = ("queue", "monitor")
"""The queue verifies submissions with the teams' keys; the monitor takes each team's read token."""


def team_files(queues: Path | None, credentials: Path | None) -> dict[str, list[str]]:
    """The options that give the services the teams' files: the queues to the queue and the scheduler, the keys to
    the queue and the monitor. Each file is checked first: a bad one starts nothing."""
    from shardyard.queues_file import read_queues
    from shardyard.quotas import QueuesFileError
    from shardyard.signing import read_credentials

    extra: dict[str, list[str]] = {}
    if queues is not None:
        try:
            read_queues(queues)
        except QueuesFileError as error:
            raise ClusterError(f"queues file {queues} refused: {error}") from None
        for service in QUEUES_FILE_TO:
            extra.setdefault(service, []).extend(["--queues-file", str(queues.resolve())])
    if credentials is not None:
        read_credentials(credentials)  # a CredentialsError names the file and the fault
        for service in CREDENTIALS_FILE_TO:
            extra.setdefault(service, []).extend(["--credentials-file", str(credentials.resolve())])
    return extra


def cluster_secret(run_dir: Path, sign_events: bool) -> str:
    """The cluster secret's file: for ``sign_events``, the run folder's (made the first time: the events a kept log
    holds stay sealed under it, and a replica rebuilding from them must verify them), else the environment's, if
    any."""
    if sign_events:
        path = run_dir.resolve() / "cluster.secret"
        try:
            read_secret(path)
        except ConfigError:
            write_secret(path)
        return str(path)
    named = os.environ.get(SECRET_ENV)
    if named:
        read_secret(Path(named))  # refused now, naming the file, rather than by every process it starts
        return str(Path(named).resolve())
    return ""


def sealed_env(secret_file: str) -> dict[str, str]:
    """The environment that makes a process seal its events with the cluster secret in ``secret_file`` (empty:
    none)."""
    return {SECRET_ENV: secret_file} if secret_file else {}


def local_credentials(run_dir: Path, teams: Iterable[str] = (), anonymous_queue: str | None = None) -> Path:
    """A credentials file for a cluster started without one, ``RUN_DIR/credentials.yaml`` (mode 600), which
    ``submit`` signs with: a key for the ``default`` team (the queue a job goes to when it names none) and for each of
    ``teams`` (the queues file's queues), and ``anonymous_queue`` if given. The keys of an earlier ``up`` from the same
    folder are kept (what its users hold still signs); a queue that has none yet gets a new one."""
    from shardyard.signing import CredentialsError, new_secret, read_credentials

    path = run_dir.resolve() / "credentials.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    kept: dict[str, dict[str, str]] = {}
    with contextlib.suppress(CredentialsError):
        earlier = read_credentials(path) if path.exists() else None
        if earlier is not None:
            kept = {
                team: {
                    key: f"{{secret: {spec.secret}{', revoked: true' if spec.revoked else ''}}}"
                    for key, spec in keys.keys.items()
                }
                for team, keys in earlier.teams.items()
            }
    names = ["default", *sorted((set(teams) | set(kept)) - {"default"})]
    lines = ["# made by shardyard up: a key per queue; add keys for new queues here (docs/security/submissions.md)"]
    if anonymous_queue is not None:
        lines.append(f"anonymous_queue: {anonymous_queue}")
    lines.append("teams:")
    for name in names:
        lines += [f"  {name}:", "    keys:"]
        given = kept.get(name) or {"k1": f"{{secret: {new_secret()}}}"}
        lines += [f"      {key}: {spec}" for key, spec in given.items()]
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(lines) + "\n")
    scratch.replace(path)
    return path


def secured(args: argparse.Namespace, run_dir: Path) -> tuple[Path | None, bool]:
    """``up``'s and ``demo``'s credentials file and whether to seal events. By default a cluster is secured: events
    are sealed, and the queue takes only signed submissions (a local key per queue where no ``--credentials-file``
    names the teams' keys; unsigned ones only into ``--anonymous-queue``). ``--insecure`` starts an open cluster: only
    what ``--credentials-file`` and ``--sign-events`` ask for."""
    given = Path(args.credentials_file) if getattr(args, "credentials_file", None) else None
    anonymous = getattr(args, "anonymous_queue", None)
    from shardyard.quotas import NAME_PATTERN

    if anonymous is not None and not re.fullmatch(NAME_PATTERN, anonymous):
        raise ClusterError(f"--anonymous-queue {anonymous!r}: not a queue name")
    if getattr(args, "insecure", False):
        if anonymous is not None:
            raise ClusterError("--anonymous-queue is for a secured cluster: an --insecure one takes any submission")
        return given, bool(getattr(args, "sign_events", False))
    if given is not None:
        if anonymous is not None:
            raise ClusterError(f"--anonymous-queue with --credentials-file: set anonymous_queue in {given}")
        return given, True
    return local_credentials(run_dir, queue_names(getattr(args, "queues_file", None)), anonymous), True


def secure_options(command: argparse.ArgumentParser) -> None:
    """``up``'s and ``demo``'s options for how open the cluster is (secured unless ``--insecure``)."""
    command.add_argument(
        "--insecure",
        action="store_true",
        help="an open cluster: no local keys and no sealed events; the queue takes any submission unless "
        "--credentials-file names the teams' keys (default: secured, docs/security)",
    )
    command.add_argument(
        "--anonymous-queue",
        metavar="QUEUE",
        help="unsigned submissions (kcat, any Kafka client) are taken into QUEUE only (default: refused)",
    )
    command.add_argument("--secure", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for scripts


def broker_options(command: argparse.ArgumentParser, *, fresh: bool = False) -> None:
    """``up``'s and ``demo``'s options for the broker the cluster runs on (``shardyard.broker.choice``)."""
    command.add_argument(
        "--broker",
        choices=("kafka", "embedded", "external"),
        help="kafka: a local Apache Kafka, its log in RUN_DIR/kafka (the default where Java 17+ runs it); embedded: "
        "the fallback, its log in memory only; external: SHARDYARD_KAFKA_BOOTSTRAP's (env SHARDYARD_BROKER)",
    )
    if fresh:
        command.add_argument(
            "--fresh", action="store_true", help="start with an empty broker log (default: the one down left here)"
        )


def queue_names(queues_file: str | None) -> list[str]:
    """The queues of the queues file (none without one); a bad file is refused later, by :func:`team_files`."""
    if not queues_file:
        return []
    from shardyard.queues_file import read_queues
    from shardyard.quotas import QueuesFileError

    try:
        config, _version = read_queues(Path(queues_file))
    except QueuesFileError:
        return []
    return list(config.queues)


def openness(secret_file: str, credentials_file: str) -> str:
    """What ``up`` says of whether events are sealed and who may submit."""
    sealed = "events sealed" if secret_file else "events NOT sealed"
    if credentials_file:
        return f"{sealed}; submissions signed with the keys in {credentials_file} (shardyard submit uses them)"
    return f"{sealed}; any submission is taken (an open cluster: --insecure)"
