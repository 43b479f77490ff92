"""The straggler detector (``shardyard.stragglers.detector``) on progress streams: a rank slowed for good is found
once, as a slow node, after the window; a rank with a larger slice is an imbalanced job; a gang waiting on a slow
link names the link; a loaded host's passing stalls, and a gang slowed as a whole, are nothing.

The streams in ``streams/`` were recorded from real clusters (``bench/straggler.py --record``): a straggler swapped
out, a slow link (its links' measurements recorded beside the reports), an imbalanced job and healthy jobs on a
loaded host. The others are made here, to pin a bound exactly."""

import json
import random
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from shardyard.events import LinkMeasured, ShardProgress
from shardyard.links import LinkTable, slow_links
from shardyard.stragglers.detector import Bounds, Detector, Kind, Straggler

T0 = datetime(2026, 12, 7, 12, 0, 0, tzinfo=UTC)
NODES = ("node-0", "node-1", "node-2", "node-3")


def report(
    rank: int,
    second: float,
    compute_ms: float,
    *,
    step_ms: float | None = None,
    samples: float = 2.0,
    attempt: int = 1,
    job: str = "job",
) -> ShardProgress:
    step = step_ms if step_ms is not None else compute_ms
    return ShardProgress(
        occurred_at=T0 + timedelta(seconds=second),
        job_id=job,
        shard_index=rank,
        attempt=attempt,
        node_id=NODES[rank],
        step=int(second * 10),
        loss=2.0,
        samples_per_s=samples * 1000.0 / step,
        allreduce_ms=max(0.0, step - compute_ms),
        allreduce_bytes=1,
        syncs=1,
        cpu_percent=100.0,
        step_ms=step,
        compute_ms=compute_ms,
    )


def stream_with_waits(waits: list[float], own_ms: float = 100.0, ranks: int = 4) -> list[ShardProgress]:
    """Every rank's own time ``own_ms``; the gang's wait a step in second s: ``waits[s]``."""
    return [
        report(rank, second, own_ms, step_ms=own_ms + wait)
        for second, wait in enumerate(waits)
        for rank in range(ranks)
    ]


def stream(
    seconds: int,
    own_ms: dict[int, list[float]] | None = None,
    *,
    base_ms: float = 100.0,
    wait_ms: float = 0.0,
    samples: dict[int, float] | None = None,
    ranks: int = 4,
) -> list[ShardProgress]:
    """One report a second per rank; rank r's own time ``own_ms[r][second]`` (else ``base_ms``); every rank's step
    lasts the slowest rank's own time plus ``wait_ms``."""
    out = []
    for second in range(seconds):
        own = {r: (own_ms or {}).get(r, [base_ms] * seconds)[second] for r in range(ranks)}
        step = max(own.values()) + wait_ms
        for rank in range(ranks):
            out.append(report(rank, second, own[rank], step_ms=step, samples=(samples or {}).get(rank, 2.0)))
    return out


STREAMS = Path(__file__).parent / "streams"


def recorded(name: str) -> list[ShardProgress | LinkMeasured]:
    """A recorded stream (``bench/straggler.py --record``): each report's line [seconds from its first line, job,
    rank, attempt, node, samples/s, step ms, own ms], each link's [seconds, "link", node, peer, median RTT ms] (what
    the detector reads; the rest is filled in)."""
    out: list[ShardProgress | LinkMeasured] = []
    for line in (STREAMS / name).read_text().splitlines():
        values = json.loads(line)
        if len(values) == 5:  # a link's line
            t, _link, node, peer, rtt_ms = values
            at = T0 + timedelta(seconds=t)
            out.append(
                LinkMeasured(
                    occurred_at=at, node_id=node, peer_id=peer, rtt_median_ms=rtt_ms, rtt_p90_ms=rtt_ms, samples=1
                )
            )
            continue
        t, job, rank, attempt, node, samples_per_s, step_ms, compute_ms = values
        out.append(
            ShardProgress(
                occurred_at=T0 + timedelta(seconds=t),
                job_id=job,
                shard_index=rank,
                attempt=attempt,
                node_id=node,
                step=0,
                loss=0.0,
                samples_per_s=samples_per_s,
                allreduce_ms=0.0,
                allreduce_bytes=0,
                syncs=0,
                cpu_percent=0.0,
                step_ms=step_ms,
                compute_ms=compute_ms,
            )
        )
    return out


def replayed(name: str) -> list[Straggler]:
    """The verdicts on a recorded stream, its links measured as the fault manager keeps them (``LinkTable``)."""
    table = LinkTable()

    def slow(nodes: set[str], at: datetime) -> list[tuple[str, str, str]]:
        return [(s.link.a, s.link.b, s.why) for s in slow_links(list(table.links(at, among=nodes).values()))]

    detector, found = Detector(slow_links=slow), []
    for event in recorded(name):
        if isinstance(event, LinkMeasured):
            table.apply(event)
        elif (verdict := detector.observe(event)) is not None:
            found.append(verdict)
    return found


def verdicts(events: Iterable[ShardProgress], detector: Detector | None = None) -> list[Straggler]:
    found = detector or Detector()
    return [v for e in events if (v := found.observe(e)) is not None]


def test_a_rank_slowed_to_half_speed_is_a_slow_node_once_the_window_has_passed() -> None:
    slow = [100.0] * 30 + [200.0] * 60  # halved from second 30
    found = verdicts(stream(90, {2: slow}))
    assert len(found) == 1, found
    (straggler,) = found
    assert (straggler.kind, straggler.shard_index, straggler.node_id) == (Kind.SLOW_NODE, 2, "node-2")
    assert straggler.since == T0 + timedelta(seconds=30)
    assert 1.9 < straggler.ratio < 2.1
    assert "rank 2 on node-2" in straggler.detail


def test_the_verdict_comes_once_four_in_five_reports_of_the_window_are_slow() -> None:
    slow = [100.0] * 10 + [200.0] * 50  # from second 10: the window of second 25 holds 16 slow reports of 20
    detector = Detector(Bounds(window_s=20.0))
    times = [e.occurred_at for e in stream(60, {1: slow}) if detector.observe(e) is not None]
    assert times == [T0 + timedelta(seconds=25)]


def test_a_noisy_straggler_is_found_from_the_windows_medians() -> None:
    rng = random.Random(3)
    # Own times of a few ms on a busy host: each report off by up to half; rank 1 at twice the others' from second 5.
    own = {r: [rng.uniform(0.6, 1.4) * (30.0 if r == 1 and s >= 5 else 15.0) for s in range(60)] for r in range(4)}
    found = verdicts(stream(60, own))
    assert [(v.kind, v.shard_index) for v in found] == [(Kind.SLOW_NODE, 1)]
    assert (found[0].since - T0).total_seconds() < 10


def test_a_rank_with_a_larger_slice_is_an_imbalanced_job_not_a_slow_node() -> None:
    # Rank 0 takes 4 samples a step where the others take 2, and twice their time: per sample it is as fast.
    found = verdicts(stream(60, {0: [200.0] * 60}, samples={0: 4.0}))
    assert [(v.kind, v.shard_index) for v in found] == [(Kind.IMBALANCED_JOB, 0)]


def test_a_gang_waiting_on_a_slow_link_names_the_link_not_a_node() -> None:
    def slow_links(nodes: set[str], _at: datetime) -> list[tuple[str, str, str]]:
        return [("node-1", "node-3", "RTT 40.0 ms, the cluster's 0.10 ms")] if {"node-1", "node-3"} <= nodes else []

    waits = [30.0] * 20 + [150.0] * 40  # the link turned slow at second 20
    found = verdicts(stream_with_waits(waits), Detector(slow_links=slow_links))
    assert [(v.kind, v.node_id, v.peer_id, v.shard_index) for v in found] == [
        (Kind.SLOW_LINK, "node-1", "node-3", None)
    ]
    assert found[0].ratio == 5.0 and found[0].since == T0 + timedelta(seconds=20)


def test_a_gang_that_always_waited_as_long_blames_no_link() -> None:
    def slow_links(_nodes: set[str], _at: datetime) -> list[tuple[str, str, str]]:
        return [("node-1", "node-3", "RTT 4.0 ms, the cluster's 0.50 ms")]  # a loaded host's loopback probes

    assert verdicts(stream_with_waits([250.0] * 60), Detector(slow_links=slow_links)) == []


def test_waits_without_a_slow_link_are_not_judged() -> None:
    waits = [30.0] * 20 + [150.0] * 40
    assert verdicts(stream_with_waits(waits), Detector(slow_links=lambda _nodes, _at: [])) == []


def test_passing_stalls_on_a_loaded_host_are_not_stragglers() -> None:
    rng = random.Random(7)
    # Every rank: noisy own times, and now and then a stall of 2-3x for a few seconds, never 20 s in a row.
    own = {}
    for rank in range(4):
        times = [rng.gauss(100.0, 12.0) for _ in range(600)]
        for start in rng.sample(range(0, 590), 25):
            for s in range(start, start + rng.randint(1, 8)):
                times[s] *= rng.uniform(2.0, 3.0)
        own[rank] = times
    assert verdicts(stream(600, own)) == []


def test_a_gang_slowed_as_a_whole_has_no_straggler() -> None:
    slowed = [100.0] * 20 + [250.0] * 40
    assert verdicts(stream(60, dict.fromkeys(range(4), slowed))) == []


def test_a_new_attempt_starts_afresh() -> None:
    detector = Detector()
    first = [e for e in stream(60, {2: [200.0] * 60})]
    assert len(verdicts(first, detector)) == 1
    again = [e.model_copy(update={"attempt": 2}) for e in stream(60, {2: [200.0] * 60})]
    assert [(v.attempt, v.shard_index) for v in verdicts(again, detector)] == [(2, 2)]


def test_reports_of_an_earlier_runner_without_the_figures_are_ignored() -> None:
    old = [e.model_copy(update={"compute_ms": 0.0, "step_ms": 0.0}) for e in stream(60, {2: [200.0] * 60})]
    assert verdicts(old) == []


def test_a_recorded_straggler_is_found_once_and_its_replacement_gang_is_left_alone() -> None:
    """A 4-shard job on a 2-core host (its own time a step about 15 ms, a step about 40 ms: mostly the gang's
    AllReduce); rank 2's node slowed to half speed after 30 s of training; the gang re-formed without it (attempt 2)."""
    found = replayed("straggler_swapped.jsonl")
    assert [(v.kind, v.attempt, v.shard_index) for v in found] == [(Kind.SLOW_NODE, 1, 2)]
    assert (found[0].since - T0).total_seconds() > 25  # not before the slow-down
    assert 1.4 < found[0].ratio < 2.2


def test_recorded_healthy_gangs_on_a_loaded_host_have_no_straggler() -> None:
    """Four 2-shard jobs on a 2-core host beside two CPU hogs for ten minutes: own times of a few ms that swing by
    half from one report to the next."""
    stream = [e for e in recorded("healthy_loaded.jsonl") if isinstance(e, ShardProgress)]
    assert len({e.job_id for e in stream}) == 4 and (stream[-1].occurred_at - T0).total_seconds() > 600
    assert replayed("healthy_loaded.jsonl") == []


def test_a_recorded_slow_link_names_a_link_of_the_slowed_node_and_no_rank() -> None:
    """A 4-shard job on five nodes of a 2-core host (a step about 70 ms, most of it the gang's wait); after 30 s of
    training, node-2's network made 300 ms slower a round trip (the test-only hook: each sync of its shard waits that
    long, and its links' probes take that long more). The links as the agents measured them are in the recording.
    On a loaded host single reports of a rank's own time swing by half: the slow link is judged all the same."""
    stream = recorded("slow_link.jsonl")
    slowed = next(e for e in stream if isinstance(e, LinkMeasured) and e.rtt_median_ms >= 300)
    found = replayed("slow_link.jsonl")
    assert [(v.kind, v.attempt, v.shard_index) for v in found] == [(Kind.SLOW_LINK, 1, None)]
    assert "node-2" in (found[0].node_id, found[0].peer_id) and found[0].since >= slowed.occurred_at


def test_a_recorded_job_with_uneven_slices_is_an_imbalanced_job() -> None:
    """A job preferring 3 shards of 1 sample, running at 2 (an elastic job on two nodes): slices of 2 samples and 1
    a step, on a 2-core host. Rank 0 takes about 1.6x rank 1's own time a step, and the same per sample."""
    found = replayed("imbalanced.jsonl")
    assert [(v.kind, v.attempt, v.shard_index) for v in found] == [(Kind.IMBALANCED_JOB, 1, 0)]
    assert 1.4 < found[0].ratio < 2.0
