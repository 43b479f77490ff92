"""Accounting URLs: which file a SQLite URL names, the local cluster's default, and a URL fit to print."""

from pathlib import Path
from typing import Final
from urllib.parse import urlsplit, urlunsplit

DATABASE_FILE: Final = "accounting.db"
POSTGRES_SCHEMES: Final = ("postgresql", "postgres")


def default_url(run_dir: Path) -> str:
    """The local cluster's database: ``accounting.db`` in its run folder."""
    return f"sqlite://{(run_dir / DATABASE_FILE).resolve()}"


def sqlite_path(url: str) -> Path | None:
    """The file a SQLite URL (or a plain path) names; None for a URL of another scheme."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        rest = url[len("sqlite:") :]
        return Path(rest[2:] if rest.startswith("//") else rest)
    return Path(url) if scheme == "" else None


def redacted(url: str) -> str:
    """``url`` fit for a log line or an error: without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
