"""The shard-attempt table of the agent's book: every state has an entry; every allowed move is taken by the event
that should take it; every other move is refused, changes nothing and is logged."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from shardyard.node_agent.book import ENTRY, TRANSITIONS, AgentBook, NotRunning, ShardAttempt, Verdict, can_move
from tests.unit.agent.test_agent_book import revocation, stop_request
from tests.unit.builders import assignment, at

KEY = ("job-1", 0, 1)
S = ShardAttempt
ALLOWED = [(src, dst) for src in S for dst in sorted(TRANSITIONS[src])]
REFUSED = [(src, dst) for src in S for dst in S if dst not in TRANSITIONS[src]]


def promote(book: AgentBook) -> None:
    book.on_assignment(assignment())


def revoke(book: AgentBook) -> None:
    book.on_revocation(revocation())


def stop(book: AgentBook) -> None:
    book.on_stop_request(stop_request())


def finish(book: AgentBook) -> None:
    book.finished(KEY, 0, now=at(9), final=None, message="exit code 0")


TAKEN_BY: dict[tuple[ShardAttempt, ShardAttempt], Callable[[AgentBook], None]] = {
    (S.SPARE, S.RUNNING): promote,
    (S.SPARE, S.RELEASED): revoke,
    (S.RUNNING, S.STOPPING): stop,
    (S.RUNNING, S.REVOKED): revoke,
    (S.RUNNING, S.ENDED): finish,
    (S.STOPPING, S.REVOKED): revoke,
    (S.STOPPING, S.ENDED): finish,
    (S.REVOKED, S.REVOKED): revoke,
    (S.REVOKED, S.ENDED): finish,
}
"""The event that takes each allowed move."""

PATH: dict[ShardAttempt, list[Callable[[AgentBook], None]]] = {
    S.SPARE: [],
    S.RUNNING: [],
    S.STOPPING: [stop],
    S.REVOKED: [revoke],
    S.ENDED: [finish],
    S.RELEASED: [revoke],
}
"""How the attempt reaches each state from its first assignment (a spare for SPARE and RELEASED)."""


def book_in(state: ShardAttempt) -> AgentBook:
    book = AgentBook("node-a")
    book.on_assignment(assignment(spare=state in (S.SPARE, S.RELEASED)))
    for event in PATH[state]:
        event(book)
    assert book.states[KEY] is state
    return book


def test_every_state_has_an_entry_and_only_entry_states_start_an_attempt() -> None:
    assert set(TRANSITIONS) == set(S)
    assert {state for state in S if can_move(None, state)} == ENTRY == {S.SPARE, S.RUNNING}


def test_every_allowed_move_has_its_event() -> None:
    assert set(TAKEN_BY) == set(ALLOWED)


@pytest.mark.parametrize(("src", "dst"), ALLOWED, ids=[f"{a}->{b}" for a, b in ALLOWED])
def test_an_allowed_move_is_taken_by_its_event(src: ShardAttempt, dst: ShardAttempt) -> None:
    assert can_move(src, dst)
    book = book_in(src)

    TAKEN_BY[(src, dst)](book)

    assert book.states[KEY] is dst


@pytest.mark.parametrize(("src", "dst"), REFUSED, ids=[f"{a}->{b}" for a, b in REFUSED])
def test_every_other_move_is_refused(src: ShardAttempt, dst: ShardAttempt) -> None:
    assert not can_move(src, dst)


@pytest.mark.parametrize(
    ("state", "event", "outcome"),
    [
        pytest.param(S.ENDED, lambda b: b.on_assignment(assignment()), Verdict.DUPLICATE, id="ended-assigned-again"),
        pytest.param(
            S.RELEASED, lambda b: b.on_assignment(assignment()), Verdict.DUPLICATE, id="released-spare-promoted"
        ),
        pytest.param(S.RUNNING, lambda b: b.on_assignment(assignment(spare=True)), Verdict.DUPLICATE, id="demoted"),
        pytest.param(S.SPARE, lambda b: b.on_stop_request(stop_request()), None, id="spare-asked-to-stop"),
        pytest.param(S.REVOKED, lambda b: b.on_stop_request(stop_request()), None, id="revoked-asked-to-stop"),
        pytest.param(S.ENDED, lambda b: b.on_revocation(revocation()), None, id="ended-revoked"),
    ],
)
def test_a_refused_move_changes_nothing_and_is_logged(
    state: ShardAttempt,
    event: Callable[[AgentBook], object],
    outcome: object,
    caplog: pytest.LogCaptureFixture,
) -> None:
    book = book_in(state)
    caplog.set_level(logging.DEBUG, logger="shardyard.node_agent.book")

    assert event(book) == outcome

    assert book.states[KEY] is state
    assert any("no move from" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("state", [S.SPARE, S.ENDED, S.RELEASED])
def test_the_end_of_an_attempt_that_is_not_running_is_an_error(state: ShardAttempt) -> None:
    book = book_in(state)

    with pytest.raises(NotRunning):
        finish(book)
    assert book.states[KEY] is state


def test_an_attempt_never_seen_cannot_end_or_be_stopped() -> None:
    book = AgentBook("node-a")

    assert (book.on_revocation(revocation()), book.on_stop_request(stop_request())) == (None, None)
    with pytest.raises(NotRunning):
        finish(book)
    assert book.states == {}


def test_the_views_follow_the_states() -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment(shard_index=0))
    book.on_assignment(assignment(shard_index=1))
    book.on_assignment(assignment(shard_index=2))
    book.on_assignment(assignment(shard_index=3, spare=True))
    book.on_stop_request(stop_request(shard_index=1))
    book.on_revocation(revocation(shard_index=2))

    assert sorted(book.running) == [("job-1", 0, 1), ("job-1", 1, 1), ("job-1", 2, 1)]
    assert (set(book.spares), book.stopping, book.revoked) == ({("job-1", 3, 1)}, {("job-1", 1, 1)}, {("job-1", 2, 1)})
    assert book.holding() == {"job-1"} and book.running_of("job-1") == 3
