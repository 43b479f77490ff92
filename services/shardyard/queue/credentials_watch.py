"""The credentials file, watched: each queue replica reads it again when it changes (every ``POLL_S``), so adding a
key, revoking one or adding a team takes effect within seconds, without a restart. A file that does not read or
validate is refused whole: the replica logs the reason and keeps the credentials in force. The replay cache is
kept across reloads: a signature seen before a reload is still a replay after it."""

import hashlib
import logging
from pathlib import Path

from shardyard.queue.auth import Gate
from shardyard.signing import CredentialsError, read_credentials

log = logging.getLogger(__name__)


class CredentialsWatch:
    def __init__(self, path: Path, gate: Gate) -> None:
        self.path = path
        self.gate = gate
        self._seen = self._version()
        self.error: CredentialsError | None = None
        """Why the file last read was refused (None: it was good)."""

    def _version(self) -> str | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError:
            return None

    def poll(self) -> bool:
        """Read the file again if it changed; True when new credentials are now in force."""
        version = self._version()
        if version == self._seen:
            return False
        self._seen = version
        try:
            credentials = read_credentials(self.path)
        except CredentialsError as error:
            self.error = error
            log.error("credentials file refused (the credentials in force stay): %s", error)
            return False
        self.error, self.gate.credentials = None, credentials
        log.info("credentials file %s read again: %d teams", self.path, len(credentials.teams))
        return True

    async def tick(self) -> None:
        self.poll()
