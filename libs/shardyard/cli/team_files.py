"""The teams' files ``shardyard up`` hands the services: the queues file (the queue and the scheduler read it, again
on each change, and publish it) and the credentials file (the queue verifies submissions with it)."""

from pathlib import Path

from shardyard.errors import ClusterError

QUEUES_FILE_TO = ("queue", "scheduler")


def team_files(queues: Path | None, credentials: Path | None) -> dict[str, list[str]]:
    """The options that give the services the teams' files: the queues to the queue and the scheduler, the keys to
    the queue. Each file is checked first: a bad one starts nothing."""
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
        extra.setdefault("queue", []).extend(["--credentials-file", str(credentials.resolve())])
    return extra
