"""Where the local Apache Kafka is installed, and whether this host can run it.

``./dev`` installs the version pinned in ``deploy/kafka/pom.xml`` from Maven Central into ``.kafka/`` of the
checkout: its jars in ``libs/`` and, written last, ``VERSION``. ``SHARDYARD_KAFKA_HOME`` names another such folder
(an installed wheel has no checkout). Kafka 4 needs Java 17 or newer: ``SHARDYARD_JAVA``, else ``$JAVA_HOME/bin/java``,
else ``java`` on the PATH.
"""

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

HOME_ENV: Final = "SHARDYARD_KAFKA_HOME"
JAVA_ENV: Final = "SHARDYARD_JAVA"
MIN_JAVA: Final = 17
CHECKOUT: Final = Path(__file__).resolve().parents[3]
"""The checkout this package runs from (in dev mode, as ``./dev`` installs it)."""
DEFAULT_HOME: Final = CHECKOUT / ".kafka"


@dataclass(frozen=True)
class KafkaInstall:
    """An installed Kafka: its folder (``libs/``, ``VERSION``), its version and the Java that runs it."""

    home: Path
    version: str
    java: str

    @property
    def classpath(self) -> str:
        return str(self.home / "libs" / "*")


def find_install(env: Mapping[str, str] | None = None) -> tuple[KafkaInstall | None, str]:
    """The local Kafka this host can run, or None and why not (which is what ``up`` says when it falls back)."""
    env = os.environ if env is None else env
    home = Path(env[HOME_ENV]) if env.get(HOME_ENV) else DEFAULT_HOME
    try:
        version = (home / "VERSION").read_text().strip()
    except OSError:
        return None, f"no Apache Kafka is installed in {home} (`./dev setup` installs it where Java and mvn are)"
    java, why = find_java(env)
    if java is None:
        return None, why
    return KafkaInstall(home, version, java), f"Apache Kafka {version} from {home}, on {why}"


def find_java(env: Mapping[str, str]) -> tuple[str | None, str]:
    """A Java of at least ``MIN_JAVA``, and what it is; None and why not."""
    candidates = [env.get(JAVA_ENV, "")]
    if env.get("JAVA_HOME"):
        candidates.append(str(Path(env["JAVA_HOME"]) / "bin" / "java"))
    candidates.append(shutil.which("java", path=env.get("PATH")) or "")
    for java in filter(None, candidates):
        major = java_major(java)
        if major is not None and major >= MIN_JAVA:
            return java, f"Java {major} ({java})"
    found = ", ".join(f"{j} ({java_major(j) or 'not runnable'})" for j in filter(None, candidates)) or "none"
    return None, f"Apache Kafka needs Java {MIN_JAVA} or newer: found {found}"


def java_major(java: str) -> int | None:
    """The major version ``java -version`` reports (``1.8`` is 8); None when it does not run."""
    try:
        said = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=20).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', said)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major
