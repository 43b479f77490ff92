"""Where a local-SGD gang stops on a notice between two syncs (:mod:`shardyard.training.notice`): ranks as threads,
each a client of one real TCPStore, as the ranks of a gang are of their rendezvous' store."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest
import torch.distributed as dist

from shardyard.training.notice import NoticeError, NoticeStop

SYNC = 100
"""The step of the interval's regular sync."""


@dataclass(frozen=True)
class Rank:
    start: int
    """The step it is at when the scenario begins (ranks of local SGD run apart between syncs)."""
    noticed: int | None
    """The first step after which it has the notice (None: it never gets it)."""


@pytest.fixture(scope="module")
def clients() -> Iterator[list[dist.TCPStore]]:
    """One store and a client of it per rank for the whole module (a connection to a TCPStore sometimes takes 5 s
    here: made once); each test has keys of its own."""
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    yield [dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=10)) for _ in range(4)]
    del master


@pytest.fixture
def stores(clients: list[dist.TCPStore]) -> Callable[[], dist.Store]:
    """Each call: the next rank's client, its keys under a prefix of this test's."""
    prefix, handed = uuid.uuid4().hex, iter(clients)

    def client() -> dist.Store:
        return dist.PrefixStore(prefix, next(handed))

    return client


def run(ranks: list[Rank], client: Callable[[], dist.Store], timeout_s: float = 10.0) -> list[tuple[str, int]]:
    """Every rank trains from its start: after each step, once it has the notice, it asks where to stop; at the
    regular sync it closes the interval first. Each ends ``("stop", t)`` or ``("sync", SYNC)``."""
    ends: list[tuple[str, int] | BaseException | None] = [None] * len(ranks)

    def rank(index: int, me: Rank) -> None:
        notice = NoticeStop(client(), len(ranks), timeout_s=timeout_s, prefix="test")
        try:
            for step in range(me.start, SYNC):
                if me.noticed is not None and step >= me.noticed and notice.at_boundary(step, SYNC):
                    ends[index] = ("stop", step)
                    return
            notice.closing(SYNC)
            ends[index] = ("sync", SYNC)
        except BaseException as exc:
            ends[index] = exc

    threads = [threading.Thread(target=rank, args=(i, me)) for i, me in enumerate(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s + 5)
    for end in ends:
        if isinstance(end, BaseException):
            raise end
    assert all(end is not None for end in ends), ends
    return [end for end in ends if isinstance(end, tuple)]


def test_one_rank_stops_at_once() -> None:
    class NoStore:  # a gang of one never looks at its store
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"store.{name} used")

    assert NoticeStop(NoStore(), 1, timeout_s=1).at_boundary(3, SYNC)  # type: ignore[arg-type]


def test_ranks_noticed_at_different_steps_stop_together_at_the_furthest(
    stores: Callable[[], dist.Store],
) -> None:
    ends = run([Rank(start=3, noticed=3), Rank(start=7, noticed=7), Rank(start=5, noticed=5)], stores)

    assert ends == [("stop", 7)] * 3


def test_a_rank_without_the_notice_closes_the_interval_and_the_gang_stops_at_the_sync(
    stores: Callable[[], dist.Store],
) -> None:
    ends = run([Rank(start=10, noticed=10), Rank(start=50, noticed=None)], stores)

    assert ends == [("sync", SYNC)] * 2


def test_a_rank_that_passed_the_stop_point_before_its_notice_moves_it_on(
    stores: Callable[[], dist.Store],
) -> None:
    ends = run([Rank(start=10, noticed=10), Rank(start=10, noticed=40)], stores)

    assert ends == [("stop", 40)] * 2


@pytest.mark.parametrize("seed", range(20), ids=lambda seed: f"seed{seed}")
def test_whatever_the_steps_every_rank_ends_alike_and_nobody_passes_the_stop(
    stores: Callable[[], dist.Store], seed: int
) -> None:
    draw = random.Random(seed)
    ranks = []
    for _ in range(draw.randint(2, 4)):
        start = draw.randint(1, SYNC - 1)
        ranks.append(Rank(start, None if draw.random() < 0.15 else draw.randint(start, SYNC + 5)))

    ends = run(ranks, stores)

    assert len(set(ends)) == 1, (ranks, ends)
    kind, step = ends[0]
    if kind == "stop":  # a stop point every rank reached with the notice, at or after its first step
        assert all(me.noticed is not None and me.start <= step and me.noticed <= step for me in ranks), ranks


def test_a_peer_that_never_arrives_fails_the_wait_after_the_timeout(stores: Callable[[], dist.Store]) -> None:
    notice = NoticeStop(stores(), 2, timeout_s=0.5, prefix="lonely")

    with pytest.raises(RuntimeError):
        notice.at_boundary(4, SYNC)


def test_a_value_the_protocol_never_writes_is_an_error(stores: Callable[[], dist.Store]) -> None:
    store = stores()
    store.set("odd/100", "what")

    with pytest.raises(NoticeError, match="'what'"):
        NoticeStop(store, 2, timeout_s=1, prefix="odd").closing(SYNC)


def test_the_key_of_an_interval_is_forgotten_after_its_sync(stores: Callable[[], dist.Store]) -> None:
    """A run syncs thousands of times: each interval's key goes once every rank is past its sync."""
    ranks = [NoticeStop(stores(), 2, timeout_s=5, prefix="test") for _ in range(2)]
    for notice in ranks:
        notice.closing(SYNC)
    store = ranks[0].store
    assert store.check(["test/100"])

    ranks[0].forget(SYNC)

    assert not store.check(["test/100"])
