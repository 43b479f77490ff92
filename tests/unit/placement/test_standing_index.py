"""The standing index decides as a fresh index of the same nodes would, cycle after cycle, while nodes change, arrive
and leave between cycles; a cycle leaves it as it found it."""

import random
from dataclasses import replace

import pytest

from shardyard.events import JobReady, NodeStatus
from shardyard.placement.cycle import schedule
from shardyard.placement.model import NodeView, PendingJob, Policy, Preempt, RunningJob, Snapshot
from shardyard.placement.snapshot import build_snapshot
from shardyard.placement.standing import StandingIndex
from shardyard.scheduler.book import SchedulerBook
from tests.unit.builders import ARTIFACTS, at, gpus, job_spec, node_state
from tests.unit.placement_support import blocked, node, pending, placed_on, running

MODELS = ("A100", "V100", "H100")


def random_node(rng: random.Random, node_id: str) -> NodeView:
    gpus = rng.choice((2, 4, 8))
    free = tuple(sorted(rng.sample(range(gpus), rng.randint(0, gpus))))
    return node(
        node_id,
        rng.choice(MODELS),
        gpus,
        free_gpus=free,
        cpu_load=rng.choice((0.0, 0.05, 0.1, 0.25, 0.4, 0.49, 0.6)),
        status=rng.choice((NodeStatus.ALIVE,) * 8 + (NodeStatus.SUSPECT, NodeStatus.LOST)),
        draining=rng.random() < 0.05,
        zone=rng.choice(("", "", "z1", "z2")),
        artifacts=rng.choice((ARTIFACTS, {}, {"/data/models/gpt2": "local", "/data/datasets/wikitext": "local"})),
        free_memory_bytes=rng.choice((256, 64, 16)) * 2**30,
    )


def random_jobs(rng: random.Random, cycle: int) -> list[PendingJob]:
    return [
        pending(
            f"job-{cycle}-{j}",
            ready=rng.random(),
            gpu_count=rng.choice((1, 2, 4, 8, 16)),
            gpu_model=rng.choice((*MODELS, None)),
            min_tflops=rng.choice((10.0, 15.0, 35.0)),
            priority=rng.randint(0, 5),
        )
        for j in range(rng.randint(1, 12))
    ]


def random_gangs(rng: random.Random, nodes: dict[str, NodeView]) -> tuple[RunningJob, ...]:
    busy = [view for view in nodes.values() if view.total_gpus > len(view.free_gpus)]
    gangs = []
    for g, view in enumerate(rng.sample(busy, min(len(busy), 3))):
        taken = tuple(i for i in range(view.total_gpus) if i not in view.free_gpus)
        gangs.append(running(f"gang-{g}", (view.node_id, taken), priority=rng.randint(0, 3)))
    return tuple(gangs)


@pytest.mark.parametrize("seed", range(12))
def test_the_standing_index_decides_as_a_fresh_index_cycle_after_cycle(seed: int) -> None:
    rng = random.Random(seed)
    policy = Policy()
    nodes = {f"n{i}": random_node(rng, f"n{i}") for i in range(rng.randint(5, 60))}
    standing = StandingIndex(nodes.values(), policy)
    for cycle in range(15):
        # Between cycles: some nodes change, some leave, some arrive (as their states or gangs change).
        for node_id in rng.sample(sorted(nodes), min(len(nodes), rng.randint(0, 8))):
            if rng.random() < 0.15:
                del nodes[node_id]
                standing.remove(node_id)
            else:
                nodes[node_id] = random_node(rng, node_id)
                standing.update(nodes[node_id])
        for n in range(rng.randint(0, 3)):
            node_id = f"n-new-{cycle}-{n}"
            nodes[node_id] = random_node(rng, node_id)
            standing.update(nodes[node_id])
        snapshot = Snapshot(tuple(nodes.values()), random_gangs(rng, nodes))
        jobs = random_jobs(rng, cycle)
        now = at(rng.choice((1.0, 400.0)))

        fresh = schedule(snapshot, jobs, policy, now=now)
        kept = schedule(snapshot, jobs, policy, now=now, index=standing)
        again = schedule(snapshot, jobs, policy, now=now, index=standing)  # the first left it as it was

        assert kept == fresh
        assert again == fresh


def test_a_cycle_leaves_the_standing_index_as_it_found_it() -> None:
    nodes = [node(f"n{i}", gpus=8, cpu_load=0.1 * (i % 4)) for i in range(6)]
    standing = StandingIndex(nodes, Policy())
    before = {slot.node_id: (list(slot.free), slot.bucket, slot.memory) for slot in standing.slots.values()}

    decisions = schedule(Snapshot(tuple(nodes)), [pending("big", gpu_count=40)], Policy(), now=at(1), index=standing)

    assert decisions and {s.node_id: (list(s.free), s.bucket, s.memory) for s in standing.slots.values()} == before
    assert {group.reserved for group in standing.groups.values()} == {0}


def test_an_updated_node_is_placed_on_with_its_new_view() -> None:
    standing = StandingIndex([node("n1", gpus=2, free_gpus=())], Policy())
    snapshot = Snapshot((node("n1", gpus=2),))
    standing.update(snapshot.nodes[0])

    (decision,) = schedule(snapshot, [pending("job", gpu_count=2)], Policy(), now=at(1), index=standing)

    assert [p.node_id for p in decision.placements] == ["n1", "n1"]  # type: ignore[union-attr]


def test_a_removed_node_is_not_placed_on() -> None:
    standing = StandingIndex([node("n1"), node("n2")], Policy())
    standing.remove("n1")

    (decision,) = schedule(Snapshot((node("n2"),)), [pending("job")], Policy(), now=at(1), index=standing)

    assert {p.node_id for p in decision.placements} == {"n2"}  # type: ignore[union-attr]
    assert replace(standing.slots["n2"].view) == node("n2")


@pytest.mark.parametrize("seed", range(6))
def test_the_books_kept_views_are_the_snapshot_built_afresh(seed: int) -> None:
    rng = random.Random(seed)
    book = SchedulerBook()
    for step in range(40):
        node_id = f"n{rng.randint(0, 15)}"
        load, free = rng.choice((0.1, 0.3, 0.7)), rng.choice(((), (0,), (0, 1, 2, 3)))
        book.apply(node_state(node_id, gpus=gpus(count=4), cpu_load=load, allocated_gpus=free))
        if rng.random() < 0.4:
            job_id = f"job-{step}"
            book.apply(JobReady(occurred_at=at(step), job_id=job_id, spec=job_spec(job_id=job_id, gpu_count=2)))
        for event in book.cycle(at(step)):
            book.apply(event)
        kept = {view.node_id: view for view in book.snapshot().nodes}
        fresh = build_snapshot(book.nodes.values(), book.gangs.values())
        assert kept == {view.node_id: view for view in fresh.nodes}
        assert book.snapshot().running == fresh.running


def test_a_reservation_stays_on_its_nodes_from_cycle_to_cycle_while_they_can_still_host_it() -> None:
    """A head job of 16 GPUs holds n1 and n2 (the most free GPUs). When n3 frees more GPUs than either (a gang there
    ended, or was preempted for another job), the reservation stays where it was and a job behind it may start on
    n3: a reservation that followed the most free GPUs would take n3 and leave that job waiting, to preempt again."""
    policy = Policy(preemption=False, backfill=False)
    head, behind = pending("head", gpu_count=16), pending("behind", ready=1.0, gpu_count=6)
    first = (node("n1", gpus=8, free_gpus=(0, 1, 2, 3)), node("n2", gpus=8, free_gpus=(0, 1, 2, 3)),
             node("n3", gpus=8, free_gpus=(0, 1)))  # fmt: skip
    standing = StandingIndex(first, policy)
    schedule(Snapshot(first), [head], policy, now=at(2), index=standing)
    assert standing.reserved_before == {"head": frozenset({"n1", "n2"})}

    second = (*first[:2], node("n3", gpus=8, free_gpus=(0, 1, 2, 3, 4, 5)))
    standing.update(second[2])
    kept = schedule(Snapshot(second), [head, behind], policy, now=at(3), index=standing)
    moved = schedule(Snapshot(second), [head, behind], policy, now=at(3))  # a fresh index remembers nothing

    assert placed_on(kept[1]) == ["n3"] * 6
    assert blocked(moved[1]).node_counts == {"reserved for a higher-priority job": 2, "fewer free GPUs than shards": 1}


def test_the_gpus_a_preemption_frees_go_to_its_preemptor_not_to_a_job_decided_before_it() -> None:
    """``ahead`` ranks first (ready earlier, same priority) but sits in a retry backoff while ``preemptor`` stops
    the gang on n1. Once that gang released n1, ``ahead`` is free to go first again: without the claim it would take
    n1 and leave ``preemptor`` to preempt once more."""
    policy = Policy()
    busy = node("n1", gpus=2, free_gpus=())
    standing = StandingIndex([busy], policy)
    victim = running("victim", ("n1", (0, 1)), priority=0)
    ahead = replace(pending("ahead", ready=0.0, gpu_count=2, priority=5), not_before=at(5))
    preemptor = pending("preemptor", ready=1.0, gpu_count=2, priority=5)

    first = schedule(Snapshot((busy,), (victim,)), [ahead, preemptor], policy, now=at(2), index=standing)
    assert Preempt("victim", "preemptor") in first

    freed = node("n1", gpus=2)
    standing.update(freed)
    second = schedule(Snapshot((freed,)), [ahead, preemptor], policy, now=at(6), index=standing)
    fresh = schedule(Snapshot((freed,)), [ahead, preemptor], policy, now=at(6))  # a fresh index claims nothing

    by_job = {d.job_id: d for d in second}
    assert placed_on(by_job["preemptor"]) == ["n1", "n1"]
    assert blocked(by_job["ahead"]).node_counts == {"reserved for a higher-priority job": 1}
    assert placed_on({d.job_id: d for d in fresh}["ahead"]) == ["n1", "n1"]
