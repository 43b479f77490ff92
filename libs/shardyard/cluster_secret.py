"""The cluster secret every component seals its events with (``shardyard.bus.seal``): a file named by
``SHARDYARD_CLUSTER_SECRET_FILE``, readable by its owner only. Standard library only: the CLI reads it too."""

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from shardyard.errors import ConfigError

SECRET_ENV = "SHARDYARD_CLUSTER_SECRET_FILE"
SECRET_BYTES = 32


def read_secret(path: Path) -> bytes:
    """The cluster secret in ``path``: refused (``ConfigError``) when missing, short, or readable by others."""
    try:
        mode = path.stat().st_mode
        secret = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"{SECRET_ENV}={path}: cannot read the cluster secret: {exc.strerror}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{SECRET_ENV}={path}: the cluster secret is readable by others (chmod 600 it)")
    if len(secret) < SECRET_BYTES:
        raise ConfigError(f"{SECRET_ENV}={path}: a cluster secret has at least {SECRET_BYTES} bytes")
    return secret


def write_secret(path: Path) -> Path:
    """A new random cluster secret in ``path`` (mode 600), for ``shardyard up --sign-events``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(os.urandom(SECRET_BYTES).hex() + "\n")
    return path


def secret_from_env(environ: Mapping[str, str] | None = None) -> bytes | None:
    named = (os.environ if environ is None else environ).get(SECRET_ENV)
    return read_secret(Path(named)) if named else None
