"""When a job is worth one more warm standby on a node: for a spare held, for a gang's training shard after its
first seconds, and after a failure its gang recovers from, as many as its shards here."""

from __future__ import annotations

import pytest

from shardyard.events import Event, FailureCause, ShardAssignment
from shardyard.events.job import Entrypoint
from shardyard.node_agent.warm import Mode, StandbyPolicy
from tests.unit.builders import assignment, completed, failed, workload

KEY = ("job-1", 0, 1)
OWN_SCRIPT = workload(entrypoint=Entrypoint(command=["python", "train.py"]))


@pytest.mark.parametrize(
    ("mode", "shard", "wanted"),
    [
        pytest.param("spares", assignment(spare=True), True, id="spares"),
        pytest.param("gang", assignment(spare=True), True, id="gang"),
        pytest.param("none", assignment(spare=True), False, id="none"),
        pytest.param("gang", assignment(spare=True, workload=OWN_SCRIPT), False, id="own-script"),
    ],
)
def test_a_spare_held(mode: Mode, shard: ShardAssignment, wanted: bool) -> None:
    assert StandbyPolicy(mode).for_spare(shard) is wanted


def test_a_gang_shard_is_worth_one_once_it_trained_a_while() -> None:
    policy = StandbyPolicy("gang", gang_after_s=5.0)
    shard = assignment()

    def trained(now: float, *, first: bool = False, have: int = 0) -> bool:
        return policy.trained(KEY, shard, first=first, now=now, here=1, have=have)

    assert [trained(10.0, first=True), trained(14.9), trained(15.0), trained(20.0)] == [False, False, True, False]


def test_a_gang_with_its_standbys_here_is_worth_no_more() -> None:
    policy = StandbyPolicy("gang", gang_after_s=0.0)

    assert not policy.trained(KEY, assignment(), first=True, now=0.0, here=2, have=2)
    assert policy.due == {}  # decided: it is not asked again


@pytest.mark.parametrize(
    ("mode", "shard"),
    [
        pytest.param("spares", assignment(), id="spares-mode"),
        pytest.param("gang", assignment(world_size=1), id="single-shard"),
        pytest.param("gang", assignment(workload=OWN_SCRIPT), id="own-script"),
        pytest.param("gang", None, id="no-longer-running"),
    ],
)
def test_no_gang_standby(mode: Mode, shard: ShardAssignment | None) -> None:
    policy = StandbyPolicy(mode, gang_after_s=0.0)

    assert not policy.trained(KEY, shard, first=True, now=0.0, here=1, have=0)


@pytest.mark.parametrize(
    ("event", "wanted"),
    [
        pytest.param(failed(cause=FailureCause.COMM_ERROR), True, id="comm-error"),
        pytest.param(failed(cause=FailureCause.FENCED), True, id="fenced"),
        pytest.param(failed(cause=FailureCause.OOM), False, id="oom-keeps-the-job-off-this-node"),
        pytest.param(failed(cause=FailureCause.USER_ERROR), False, id="user-error-ends-the-job"),
        pytest.param(completed(), False, id="completed"),
        pytest.param(None, False, id="revoked"),
    ],
)
def test_after_an_end(event: Event | None, wanted: bool) -> None:
    assert StandbyPolicy("spares").ended(KEY, assignment(), event, have=0) is wanted


def test_after_a_failure_as_many_as_its_shards_here_at_once() -> None:
    policy = StandbyPolicy("gang")
    for here in (1, 3, 2):
        policy.launched("job-1", here=here)
    comm = failed(cause=FailureCause.COMM_ERROR)

    assert [policy.ended(KEY, assignment(), comm, have=have) for have in (2, 3)] == [True, False]
    policy.job_ended("job-1")
    assert policy.members == {}
    assert not policy.ended(KEY, assignment(), comm, have=1)  # one, when none of it ran here


@pytest.mark.parametrize(
    ("mode", "shard"),
    [pytest.param("none", assignment(), id="none"), pytest.param("gang", assignment(workload=OWN_SCRIPT), id="own")],
)
def test_no_standby_after_a_failure(mode: Mode, shard: ShardAssignment) -> None:
    assert not StandbyPolicy(mode).ended(KEY, shard, failed(cause=FailureCause.COMM_ERROR), have=0)


def test_an_end_forgets_a_pending_gang_standby() -> None:
    policy = StandbyPolicy("gang", gang_after_s=5.0)
    policy.trained(KEY, assignment(), first=True, now=0.0, here=1, have=0)

    policy.ended(KEY, assignment(), completed(), have=0)

    assert policy.due == {}
