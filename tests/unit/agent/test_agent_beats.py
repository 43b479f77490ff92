"""An agent sends its full heartbeat when its inventory changed or its refresh is due, and a lease otherwise."""

from shardyard.events import Heartbeat, NodeLease, RunningShard
from shardyard.node_agent.beats import Beats
from tests.unit.builders import heartbeat


def kinds(beats: Beats, sent: list[tuple[float, Heartbeat]], *, delivered: bool = True) -> list[str]:
    out = []
    for now, beat in sent:
        chosen = beats.next(beat, now)
        if delivered:
            beats.delivered(chosen, now)
        out.append(type(chosen).__name__)
    return out


def test_the_first_beat_is_full_and_the_next_unchanged_ones_are_leases() -> None:
    beats = Beats(refresh_s=10.0)

    assert kinds(beats, [(t, heartbeat(seq=t)) for t in range(4)]) == ["Heartbeat", *["NodeLease"] * 3]


def test_a_lease_carries_the_beats_liveness_and_telemetry() -> None:
    beats = Beats()
    beats.delivered(heartbeat(seq=1), 0.0)
    beat = heartbeat(seq=2, cpu_load=0.7)

    lease = beats.next(beat, 1.0)

    assert isinstance(lease, NodeLease)
    assert (lease.node_id, lease.agent_instance, lease.seq, lease.cpu_load) == ("node-a", beat.agent_instance, 2, 0.7)
    assert lease.gpu_utilization == tuple(g.utilization for g in beat.gpus)


def test_a_changed_inventory_goes_out_in_full_at_once() -> None:
    beats = Beats()
    running = (RunningShard(job_id="j", shard_index=0, attempt=1),)

    sent = kinds(beats, [(0, heartbeat()), (1, heartbeat(running=running)), (2, heartbeat(running=running))])

    assert sent == ["Heartbeat", "Heartbeat", "NodeLease"]


def test_the_full_heartbeat_is_refreshed() -> None:
    beats = Beats(refresh_s=10.0)

    sent = kinds(beats, [(t, heartbeat(seq=t)) for t in range(21)])

    assert [t for t, kind in enumerate(sent) if kind == "Heartbeat"] == [0, 10, 20]


def test_a_full_heartbeat_that_did_not_reach_the_bus_is_sent_again() -> None:
    beats = Beats()

    assert kinds(beats, [(0, heartbeat()), (1, heartbeat())], delivered=False) == ["Heartbeat", "Heartbeat"]
