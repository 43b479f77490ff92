"""A throw-away PostgreSQL server for one test module: ``initdb`` into a fresh folder, ``postgres`` on a free port of
127.0.0.1, trusted local connections, no durability (fsync off: the data lives as long as the test). PostgreSQL
refuses to run as root: as root, the server runs as the ``postgres`` user that Debian's package creates. Without the
server's binaries the test skips, saying what to install."""

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from shardyard.broker.ports import free_port
from tests.support.wait import until

SUPERUSER = "shardyard"


def server_binaries() -> Path | None:
    """The folder of ``initdb`` and ``postgres``: on PATH, else Debian's ``/usr/lib/postgresql/VERSION/bin``."""
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(versions[-1]).parent if versions else None


def _runs_as() -> tuple[int, int]:
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root and there is no `postgres` user to run PostgreSQL as (apt-get install postgresql)")
    return user.pw_uid, user.pw_gid


@contextmanager
def throwaway_postgres() -> Iterator[str]:
    """A running server; yields its URL (the superuser, the ``postgres`` database)."""
    binaries = server_binaries()
    if binaries is None:
        pytest.skip(
            "no PostgreSQL server binaries (initdb, postgres) on PATH or under /usr/lib/postgresql: "
            "apt-get install postgresql (./dev setup does)"
        )
    uid, gid = _runs_as()
    folder = Path(tempfile.mkdtemp(prefix="shardyard-pg-"))  # outside pytest's 0700 folders, which it cannot enter
    data = folder / "data"
    data.mkdir()
    for path in (folder, data):
        os.chown(path, uid, gid)
    owner = {"user": uid, "group": gid, "extra_groups": []} if os.geteuid() == 0 else {}
    init = [str(binaries / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync"]
    done = subprocess.run(init, capture_output=True, text=True, timeout=120, **owner)
    assert done.returncode == 0, f"initdb failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    port = free_port()
    settings = ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
    command = [str(binaries / "postgres"), "-D", str(data), "-p", str(port), "-k", str(folder), "-h", "127.0.0.1"]
    log = (folder / "server.log").open("wb")
    server = subprocess.Popen([*command, *settings], stdout=log, stderr=subprocess.STDOUT, **owner)
    url = f"postgresql://{SUPERUSER}@127.0.0.1:{port}/postgres"
    try:
        until(lambda: _accepts(url) or server.poll() is not None, "PostgreSQL to accept connections", 60)
        assert server.poll() is None, f"postgres exited {server.returncode}:\n{(folder / 'server.log').read_text()}"
        yield url
    finally:
        server.send_signal(signal.SIGINT)  # fast shutdown: sessions are ended, no checkpoint waited for
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def _accepts(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False
