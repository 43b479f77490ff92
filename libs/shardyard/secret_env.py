"""A job's environment values, encrypted on the bus (AES-256-GCM): nobody who reads a topic reads them.

- ``shardyard submit --credentials`` encrypts every value of ``entrypoint.env`` to the queue, under a key derived
  from the signing team's key (:func:`team_key`), before it signs the body.
- The queue, which holds the teams' keys, decrypts them and encrypts them again to the agents, under a key derived
  from the cluster secret (:func:`agents_key`); a plain value (an unsigned submission's) is encrypted too. What it
  publishes (the accepted job's spec, and the assignments made from it) carries no value in the clear. Without a
  cluster secret nothing on the bus is sealed or encrypted, and the queue publishes the values as they came.
- The agent decrypts them into the shard's environment, and nowhere else.

A value so encrypted reads ``sy-enc:v1:WHO:BASE64`` (``WHO``: ``team/TEAM/KEY_ID`` or ``agents``; ``BASE64``: a random
96-bit nonce, then the ciphertext and its tag). The job's id and the variable's name are the associated data: a value
moved to another job or variable does not decrypt."""

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from shardyard.cluster_secret import secret_from_env
from shardyard.errors import ShardyardError

PREFIX = "sy-enc:v1:"
AGENTS = "agents"
NONCE_BYTES = 12


class SecretEnvError(ShardyardError):
    """A value that does not decrypt: made for another job or variable, another key, or altered."""


def team_key(secret_hex: str) -> bytes:
    return hmac.new(bytes.fromhex(secret_hex), b"shardyard-env-v1", hashlib.sha256).digest()


def agents_key(cluster_secret: bytes) -> bytes:
    return hmac.new(cluster_secret, b"shardyard-env-agents-v1", hashlib.sha256).digest()


def agents_key_from_env() -> bytes | None:
    """The agents' key of the cluster secret the environment names (``SHARDYARD_CLUSTER_SECRET_FILE``), or None."""
    secret = secret_from_env()
    return None if secret is None else agents_key(secret)


def team_sealer(team: str, key_id: str) -> str:
    return f"team/{team}/{key_id}"


def encrypted(value: str) -> bool:
    return value.startswith(PREFIX)


def sealer_of(value: str) -> str:
    """Who a value was encrypted by (``team/TEAM/KEY_ID`` or ``agents``)."""
    return value.removeprefix(PREFIX).rpartition(":")[0]


def _aad(job_id: str, name: str) -> bytes:
    return f"{job_id}\0{name}".encode()


def encrypt(key: bytes, job_id: str, name: str, value: str, *, sealer: str) -> str:
    nonce = os.urandom(NONCE_BYTES)
    sealed = AESGCM(key).encrypt(nonce, value.encode(), _aad(job_id, name))
    return f"{PREFIX}{sealer}:{base64.urlsafe_b64encode(nonce + sealed).decode()}"


def decrypt(key: bytes, job_id: str, name: str, value: str) -> str:
    try:
        blob = base64.urlsafe_b64decode(value.rpartition(":")[2])
        return AESGCM(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], _aad(job_id, name)).decode()
    except (InvalidTag, ValueError, binascii.Error) as exc:
        raise SecretEnvError(f"{name}: the value does not decrypt (another job's, key's, or altered)") from exc


def encrypt_all(env: Mapping[str, str], key: bytes, job_id: str, *, sealer: str) -> dict[str, str]:
    return {name: encrypt(key, job_id, name, value, sealer=sealer) for name, value in env.items()}


def decrypt_all(env: Mapping[str, str], key: bytes | None, job_id: str) -> dict[str, str]:
    """The values as the shard gets them: each encrypted to the agents decrypted (``key``: the agents'; None where
    the cluster has no secret), a plain one as it is. Raises :class:`SecretEnvError` for one that cannot be."""
    opened = {}
    for name, value in env.items():
        if not encrypted(value):
            opened[name] = value
        elif key is None or sealer_of(value) != AGENTS:
            raise SecretEnvError(f"{name}: encrypted to {sealer_of(value) or '?'}, not to this node's agents")
        else:
            opened[name] = decrypt(key, job_id, name, value)
    return opened
