"""The files ``shardyard up`` hands the services: the queues file (the queue and the scheduler read it, again on each
change, and publish it), the credentials file (the queue verifies submissions with it; ``--secure`` makes a local
one) and the cluster secret every process seals its events with (``shardyard.bus.seal``)."""

import argparse
import os
from pathlib import Path

from shardyard.cluster_secret import SECRET_ENV, read_secret, write_secret
from shardyard.errors import ClusterError

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
    """The cluster secret's file: a new one in the run folder for ``sign_events``, else the environment's, if any."""
    if sign_events:
        return str(write_secret(run_dir.resolve() / "cluster.secret"))
    named = os.environ.get(SECRET_ENV)
    if named:
        read_secret(Path(named))  # refused now, naming the file, rather than by every process it starts
        return str(Path(named).resolve())
    return ""


def sealed_env(secret_file: str) -> dict[str, str]:
    """The environment that makes a process seal its events with the cluster secret in ``secret_file`` (empty:
    none)."""
    return {SECRET_ENV: secret_file} if secret_file else {}


def local_credentials(run_dir: Path) -> Path:
    """A credentials file for a cluster started ``--secure`` without one: a new key of the ``default`` team (the
    queue a job goes to when it names none), in ``RUN_DIR/credentials.yaml``, mode 600; ``submit`` signs with it."""
    from shardyard.signing import new_secret

    path = run_dir.resolve() / "credentials.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(
            f"# made by shardyard up --secure\nteams:\n  default:\n    keys:\n      k1: {{secret: {new_secret()}}}\n"
        )
    return path


def secured(args: argparse.Namespace, run_dir: Path) -> tuple[Path | None, bool]:
    """``up``'s and ``demo``'s credentials file and whether to seal events: ``--secure`` makes a local key where no
    ``--credentials-file`` is given, and seals."""
    given = Path(args.credentials_file) if getattr(args, "credentials_file", None) else None
    if not args.secure:
        return given, bool(getattr(args, "sign_events", False))
    return given or local_credentials(run_dir), True
