"""The KRaft cluster id ``up`` formats a log folder with never starts with ``-`` (the storage tool would read it as an
option and format nothing: about 1 start in 64)."""

import uuid
from unittest import mock

from shardyard.broker.kafka import _cluster_id


def test_an_id_that_would_start_with_a_dash_is_drawn_again() -> None:
    dashed = uuid.UUID(bytes=b"\xf8" + bytes(15))  # base64 "-A...": the parser's "expected one argument"
    plain = uuid.UUID(bytes=b"\x00" + bytes(15))
    with mock.patch("shardyard.broker.kafka.uuid.uuid4", side_effect=[dashed, plain]):
        found = _cluster_id()
    assert found == "AAAAAAAAAAAAAAAAAAAAAA" and len(found) == 22


def test_ids_are_22_characters_of_url_safe_base64() -> None:
    ids = {_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000 and not any(i.startswith("-") for i in ids)
    assert all(
        len(i) == 22 and set(i) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") for i in ids
    )
