"""The election's pure parts: who the sticky assignor picks, and which timings are refused."""

import pytest
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from shardyard.bus.leadership import PARTITION, ElectionTimings, sticky_assignor


def member(term: int | None) -> ConsumerProtocolMemberMetadata:
    data = b"" if term is None else str(term).encode()
    return ConsumerProtocolMemberMetadata(0, [PARTITION.topic], data)


def chosen(members: dict[str, ConsumerProtocolMemberMetadata]) -> list[str]:
    assignment = sticky_assignor(lambda: 0).assign(ClusterMetadata(), members)
    return [m for m, a in assignment.items() if a.assignment == [(PARTITION.topic, [PARTITION.partition])]]


@pytest.mark.parametrize(
    ("terms", "leader"),
    [
        pytest.param({"a": 0, "b": 0}, "a", id="nobody-led-first-member-id"),
        pytest.param({"a": 0, "b": 7}, "b", id="the-leader-keeps-it-when-a-lower-member-id-joins"),
        pytest.param({"a": 3, "b": 7}, "b", id="a-resumed-stale-leader-loses-to-the-newer-term"),
        pytest.param({"a": None, "b": 2, "c": 0}, "b", id="empty-metadata-counts-as-none"),
    ],
)
def test_the_partition_goes_to_the_latest_leader(terms: dict[str, int | None], leader: str) -> None:
    assert chosen({m: member(t) for m, t in terms.items()}) == [leader]


def test_the_assignor_reports_the_term_it_last_led_under() -> None:
    assert sticky_assignor(lambda: 12).metadata([PARTITION.topic]).user_data == b"12"


@pytest.mark.parametrize("lease_s", [0.0, 1.0, 5.0])
def test_a_lease_that_could_outlive_the_group_is_refused(lease_s: float) -> None:
    with pytest.raises(ValueError, match="lease_s"):
        ElectionTimings(session_timeout_ms=2000, heartbeat_interval_ms=250, rebalance_timeout_ms=1000, lease_s=lease_s)
