"""Kafka's transport security from the environment (``shardyard.bus.transport``): plain by default, TLS with the
CA given, SASL/SCRAM with a principal and its password file, and a clear refusal of what does not make sense."""

import ssl
from pathlib import Path

import pytest

from shardyard.bus.transport import client_options, faststream_security
from shardyard.errors import ConfigError


def test_plain_kafka_needs_nothing() -> None:
    assert client_options({}) == {} and faststream_security({}) is None


def test_sasl_over_tls_names_the_principal_and_reads_its_password(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    env = {
        "SHARDYARD_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
        "SHARDYARD_KAFKA_USERNAME": "scheduler",
        "SHARDYARD_KAFKA_PASSWORD_FILE": str(secret),
    }
    options = client_options(env)
    assert isinstance(options.pop("ssl_context"), ssl.SSLContext)
    assert options == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "scheduler",
        "sasl_plain_password": "s3cret",
    }
    security = faststream_security(env)
    assert type(security).__name__ == "SASLScram512" and security.use_ssl


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"SHARDYARD_KAFKA_SECURITY_PROTOCOL": "TLS"}, "one of PLAINTEXT, SSL"),
        ({"SHARDYARD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "needs SHARDYARD_KAFKA_USERNAME"),
        (
            {"SHARDYARD_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "SHARDYARD_KAFKA_SASL_MECHANISM": "PLAIN"},
            "SCRAM-SHA-512",
        ),
        (
            {
                "SHARDYARD_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "SHARDYARD_KAFKA_USERNAME": "q",
                "SHARDYARD_KAFKA_PASSWORD_FILE": "/nonexistent/password",
            },
            "SHARDYARD_KAFKA_PASSWORD_FILE=/nonexistent/password",
        ),
        ({"SHARDYARD_KAFKA_SECURITY_PROTOCOL": "SSL", "SHARDYARD_KAFKA_CA_FILE": "/nonexistent/ca.pem"}, "the CA"),
    ],
)
def test_a_transport_that_cannot_work_is_refused_naming_the_variable(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        client_options(env)
