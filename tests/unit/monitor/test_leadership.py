"""NO_LEADER and LEADERSHIP_HIJACKED (``monitor.leadership``): who holds the scheduler's leadership partition, as
the group coordinator says, against the sealed elections the monitor folded."""

from shardyard.events import AlertRule, LeaderElected, ServiceReady
from shardyard.monitor.holding import Member, observe
from shardyard.monitor.leadership import leadership_hijacked, no_leader
from shardyard.monitor.policy import AlertPolicy
from shardyard.monitor.views import ClusterView
from tests.unit.builders import at

POLICY = AlertPolicy()


def member(client_id: str, *, holds: bool, n: int = 0) -> Member:
    return Member(f"{client_id}-{n}", client_id, "/10.0.0.9", holds)


def replica(instance: str, *, holds: bool) -> Member:
    return member(f"scheduler-{instance}-election", holds=holds)


def view_with_replicas() -> ClusterView:
    view = ClusterView()
    for instance in ("scheduler-0", "scheduler-1"):
        view.apply(ServiceReady(occurred_at=at(0), service="scheduler", instance=instance, pid=1, host="h"))
    return view


def elected(view: ClusterView, instance: str, term: int, t: float) -> None:
    view.apply(LeaderElected(occurred_at=at(t), service="scheduler", instance=instance, term=term))


def firing(view: ClusterView, t: float) -> list[tuple[AlertRule, str]]:
    found = [*no_leader(view, at(t), POLICY), *leadership_hijacked(view, at(t), POLICY)]
    return [(c.rule, c.subject) for c in found]


def see(view: ClusterView, members: list[Member], t: float) -> None:
    view.leadership["scheduler"] = observe(view.leadership.get("scheduler"), members, at(t))


def test_a_leader_found_holding_at_the_first_look_is_proven_by_its_sealed_election_however_old() -> None:
    view = view_with_replicas()
    elected(view, "scheduler-0", 3, t=0)
    see(view, [replica("scheduler-0", holds=True), replica("scheduler-1", holds=False)], t=600)
    assert firing(view, 700) == []


def test_a_failover_is_proven_by_the_new_leaders_election() -> None:
    view = view_with_replicas()
    elected(view, "scheduler-0", 3, t=0)
    see(view, [replica("scheduler-0", holds=True), replica("scheduler-1", holds=False)], t=10)
    see(view, [replica("scheduler-1", holds=True)], t=20)  # the leader died: the group gave the partition on
    elected(view, "scheduler-1", 9, t=19)  # announced before this monitor's poll saw the change
    assert firing(view, 30) == []


def test_a_client_that_is_no_sealed_replica_holding_the_partition_is_a_hijack_after_the_bound() -> None:
    view = view_with_replicas()
    elected(view, "scheduler-0", 3, t=0)
    see(view, [replica("scheduler-0", holds=True), replica("scheduler-1", holds=False)], t=10)
    mallory = member("rdkafka", holds=True)
    see(view, [replica("scheduler-0", holds=False), replica("scheduler-1", holds=False), mallory], t=20)
    assert firing(view, 23.9) == []  # within an election's time
    assert firing(view, 24) == [(AlertRule.LEADERSHIP_HIJACKED, "scheduler")]
    see(view, [replica("scheduler-0", holds=True), replica("scheduler-1", holds=False)], t=30)  # it left
    elected(view, "scheduler-0", 12, t=29.5)
    assert firing(view, 40) == []


def test_a_hijacker_using_a_replicas_client_id_is_still_a_hijack() -> None:
    view = view_with_replicas()
    elected(view, "scheduler-0", 3, t=0)
    see(view, [replica("scheduler-0", holds=True)], t=10)
    spoof = member("scheduler-scheduler-0-election", holds=True, n=1)
    see(view, [replica("scheduler-0", holds=False), spoof], t=20)
    assert firing(view, 25) == [(AlertRule.LEADERSHIP_HIJACKED, "scheduler")]


def test_nobody_holding_or_a_replica_that_announces_no_term_is_no_leader() -> None:
    view = view_with_replicas()
    elected(view, "scheduler-0", 3, t=0)
    see(view, [replica("scheduler-0", holds=True)], t=10)
    see(view, [], t=20)  # every replica gone
    assert firing(view, 25) == [(AlertRule.NO_LEADER, "scheduler")]
    see(view, [replica("scheduler-1", holds=True)], t=30)  # holds it, never proves a term
    assert firing(view, 33) == []
    assert firing(view, 35) == [(AlertRule.NO_LEADER, "scheduler")]
