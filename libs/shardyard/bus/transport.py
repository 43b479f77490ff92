"""Kafka's own transport security for every client of a process: TLS and SASL/SCRAM from the environment.

- ``SHARDYARD_KAFKA_SECURITY_PROTOCOL``: ``PLAINTEXT`` (the default), ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``;
- ``SHARDYARD_KAFKA_CA_FILE``: the CA that signed the brokers' certificates (TLS; default: the system's CAs);
- ``SHARDYARD_KAFKA_SASL_MECHANISM``: ``SCRAM-SHA-512`` (the default) or ``SCRAM-SHA-256``;
- ``SHARDYARD_KAFKA_USERNAME`` and ``SHARDYARD_KAFKA_PASSWORD_FILE``: the principal this process is (each service
  its own, so the broker's ACLs can tell them apart: ``broker.access``), and a file holding its password.

Every producer, consumer and admin client (FastStream's and aiokafka's) takes these options, so one process talks
to the broker one way. The embedded broker speaks plain Kafka only (docs/security/broker.md).
"""

import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shardyard.errors import ConfigError

PROTOCOL_ENV = "SHARDYARD_KAFKA_SECURITY_PROTOCOL"
CA_FILE_ENV = "SHARDYARD_KAFKA_CA_FILE"
MECHANISM_ENV = "SHARDYARD_KAFKA_SASL_MECHANISM"
USERNAME_ENV = "SHARDYARD_KAFKA_USERNAME"
PASSWORD_FILE_ENV = "SHARDYARD_KAFKA_PASSWORD_FILE"
TRANSPORT_ENVS = (PROTOCOL_ENV, CA_FILE_ENV, MECHANISM_ENV, USERNAME_ENV, PASSWORD_FILE_ENV)
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")


def client_options(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The aiokafka keyword options of the environment's transport (empty for plain Kafka); a misconfiguration is a
    ``ConfigError`` naming the variable."""
    env = os.environ if environ is None else environ
    protocol = env.get(PROTOCOL_ENV, "PLAINTEXT").strip().upper() or "PLAINTEXT"
    if protocol not in PROTOCOLS:
        raise ConfigError(f"{PROTOCOL_ENV}={protocol!r}: one of {', '.join(PROTOCOLS)}")
    if protocol == "PLAINTEXT":
        return {}
    options: dict[str, Any] = {"security_protocol": protocol}
    if protocol.endswith("SSL"):
        options["ssl_context"] = _tls(env.get(CA_FILE_ENV))
    if protocol.startswith("SASL"):
        mechanism = env.get(MECHANISM_ENV, "SCRAM-SHA-512").strip().upper()
        if mechanism not in MECHANISMS:
            raise ConfigError(f"{MECHANISM_ENV}={mechanism!r}: one of {', '.join(MECHANISMS)}")
        username, password_file = env.get(USERNAME_ENV, "").strip(), env.get(PASSWORD_FILE_ENV, "").strip()
        if not username or not password_file:
            raise ConfigError(f"{protocol} needs {USERNAME_ENV} and {PASSWORD_FILE_ENV}")
        try:
            password = Path(password_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{PASSWORD_FILE_ENV}={password_file}: {exc.strerror}") from exc
        options |= {"sasl_mechanism": mechanism, "sasl_plain_username": username, "sasl_plain_password": password}
    return options


def _tls(ca_file: str | None) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{CA_FILE_ENV}={ca_file}: cannot load the CA: {exc}") from exc


def faststream_security(environ: Mapping[str, str] | None = None) -> Any:
    """The same as FastStream's broker takes it (``security=``): None for plain Kafka."""
    options = client_options(environ)
    if not options:
        return None
    from faststream.security import BaseSecurity, SASLScram256, SASLScram512

    context = options.get("ssl_context")
    if "sasl_mechanism" not in options:
        return BaseSecurity(ssl_context=context, use_ssl=True)
    scram = SASLScram512 if options["sasl_mechanism"] == "SCRAM-SHA-512" else SASLScram256
    user, password = options["sasl_plain_username"], options["sasl_plain_password"]
    return scram(user, password, ssl_context=context, use_ssl=context is not None)
