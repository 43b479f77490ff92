"""Which broker ``shardyard up`` starts, and why: the local Apache Kafka where it is installed and a Java 17 runs it,
else the embedded fallback; ``--broker`` (or ``SHARDYARD_BROKER``) asks for one, and one that cannot be had is
refused with the reason."""

import os
import stat
from pathlib import Path

import pytest

from shardyard.broker.choice import choose
from shardyard.broker.install import find_install, java_major
from shardyard.errors import ConfigError


def fake_java(folder: Path, version: str) -> Path:
    """A ``java`` that prints ``version`` as the JDK's ``java -version`` does (on standard error)."""
    java = folder / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2025-04-15' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    return java


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    home = tmp_path / "kafka-home"
    (home / "libs").mkdir(parents=True)
    (home / "VERSION").write_text("4.4.0\n")
    return home


def env_with(home: Path, java: Path | None, **more: str) -> dict[str, str]:
    env = {"SHARDYARD_KAFKA_HOME": str(home), "PATH": "/nonexistent", **more}
    if java is not None:
        env["SHARDYARD_JAVA"] = str(java)
    return env


def test_kafka_is_the_default_where_it_is_installed_and_java_17_runs_it(installed: Path, tmp_path: Path) -> None:
    choice = choose(None, env_with(installed, fake_java(tmp_path, "17.0.15")))

    assert choice.kind == "kafka"
    assert choice.install is not None and choice.install.version == "4.4.0"
    assert "the default" in choice.why and "Java 17" in choice.why


def test_without_an_install_the_embedded_broker_stands_in_and_says_why(tmp_path: Path) -> None:
    choice = choose(None, env_with(tmp_path / "nothing-here", fake_java(tmp_path, "17.0.15")))

    assert choice.kind == "embedded"
    assert "no Apache Kafka is installed" in choice.why


@pytest.mark.parametrize("version", ["11.0.2", "1.8.0_392"], ids=["java-11", "java-8"])
def test_a_java_older_than_17_does_not_run_kafka(installed: Path, tmp_path: Path, version: str) -> None:
    choice = choose(None, env_with(installed, fake_java(tmp_path, version)))

    assert choice.kind == "embedded"
    assert "needs Java 17" in choice.why


def test_asking_for_kafka_where_it_cannot_run_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--broker kafka: no Apache Kafka is installed"):
        choose("kafka", env_with(tmp_path / "none", fake_java(tmp_path, "21.0.1")))


def test_the_embedded_broker_is_taken_when_asked_for_even_where_kafka_runs(installed: Path, tmp_path: Path) -> None:
    java = fake_java(tmp_path, "17.0.1")
    assert choose("embedded", env_with(installed, java)).kind == "embedded"
    assert choose(None, env_with(installed, java, SHARDYARD_BROKER="embedded")).kind == "embedded"


def test_a_named_bootstrap_is_an_outside_broker(installed: Path, tmp_path: Path) -> None:
    env = env_with(installed, fake_java(tmp_path, "17.0.1"), SHARDYARD_KAFKA_BOOTSTRAP="kafka.example:9092")

    choice = choose(None, env)

    assert (choice.kind, choice.bootstrap) == ("external", "kafka.example:9092")
    with pytest.raises(ConfigError, match="SHARDYARD_KAFKA_BOOTSTRAP"):
        choose("external", env_with(installed, None))


def test_an_unknown_broker_is_refused(installed: Path) -> None:
    with pytest.raises(ConfigError, match="one of kafka, embedded, external"):
        choose("zookeeper", env_with(installed, None))


def test_the_version_of_a_java_that_does_not_run_is_none(tmp_path: Path) -> None:
    assert java_major(str(tmp_path / "no-java")) is None


def test_this_machines_install_if_any_names_its_version() -> None:
    install, why = find_install(os.environ)
    assert (install is None) == ("needs Java" in why or "no Apache Kafka" in why)
