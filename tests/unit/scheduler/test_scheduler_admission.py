"""Admitting a placed gang: its spares under the redundancy ratio, the rendezvous port it takes, and the events
that carry the placement out."""

from __future__ import annotations

import pytest

from shardyard.events import NodeStatus
from shardyard.events.job import Elasticity
from shardyard.placement.model import NodeView, PendingJob, Place
from shardyard.scheduler.admission import MAX_SHARDS, admit, free_port, spares, waits_for_spares
from shardyard.scheduler.gang import Gang
from tests.unit.builders import at, job_spec, placement, scheduled


def view(node_id: str = "node-a", ports: tuple[int, ...] = (29500, 29501, 29502)) -> NodeView:
    return NodeView(
        node_id=node_id,
        status=NodeStatus.ALIVE,
        address=f"{node_id}.cluster",
        gpu_model="A100",
        tflops=35.0,
        free_gpus=(0, 1),
        free_memory_bytes=0,
        free_cpu_cores=8.0,
        cpu_load=0.1,
        rendezvous_ports=ports,
    )


def coordinated(job_id: str, node_id: str, port: int) -> Gang:
    return Gang(job_spec(job_id=job_id), scheduled(job_id, node_id, coordinator_node=node_id, rendezvous_port=port))


@pytest.mark.parametrize(
    ("shards", "ratio", "expected"),
    [
        pytest.param(4, 0.0, 0, id="no-ratio-no-spares"),
        pytest.param(4, 0.1, 1, id="a-fraction-takes-a-whole-spare"),
        pytest.param(10, 0.2, 2, id="whole"),
        pytest.param(25, 0.28, 7, id="whole-but-for-float-rounding"),
        pytest.param(MAX_SHARDS + 1, 0.1, 0, id="beyond-any-admitted-shard-count"),
    ],
)
def test_spares_follow_the_ratio(shards: int, ratio: float, expected: int) -> None:
    spec = job_spec().model_copy(update={"shard_count": shards})  # unvalidated: the cycle fails such a job

    assert spares(spec, ratio) == expected


@pytest.mark.parametrize(
    ("spares_placed", "first", "after_s", "waits"),
    [
        pytest.param(1, True, 0.5, True, id="short-within-the-grace"),
        pytest.param(1, True, 2.0, False, id="short-past-the-grace-goes-without"),
        pytest.param(2, True, 0.5, False, id="all-placed"),
        pytest.param(1, False, 0.5, False, id="a-later-attempt-never-waits"),
    ],
)
def test_a_first_placement_short_of_spares_waits_for_them_a_while(
    spares_placed: int, first: bool, after_s: float, waits: bool
) -> None:
    held = tuple(placement(2 + i, "node-b").model_copy(update={"spare": True}) for i in range(spares_placed))
    place = Place("job-1", (placement(0), placement(1), *held), "node-a")
    job = PendingJob(job_spec(), at(10))

    assert waits_for_spares(place, job, wanted=2, first=first, grace_s=2.0, now=at(10 + after_s)) is waits


@pytest.mark.parametrize(
    ("gangs", "last", "expected"),
    [
        pytest.param([], None, 29500, id="the-first-port"),
        pytest.param([coordinated("job-2", "node-a", 29500)], None, 29501, id="past-another-gangs-port"),
        pytest.param([coordinated("job-2", "node-b", 29500)], None, 29500, id="a-gang-elsewhere-takes-none-here"),
        pytest.param([], ("node-a", 29500), 29501, id="not-the-jobs-previous-port-here"),
        pytest.param([], ("node-b", 29500), 29500, id="its-previous-port-elsewhere-is-free"),
        pytest.param(
            [coordinated("job-2", "node-a", 29500), coordinated("job-3", "node-a", 29502)],
            ("node-a", 29501),
            None,
            id="none-left",
        ),
    ],
)
def test_the_rendezvous_port(gangs: list[Gang], last: tuple[str, int] | None, expected: int | None) -> None:
    assert free_port(view(), gangs, last) == expected


def test_an_elastic_job_placed_below_its_preferred_size_has_the_world_size_it_was_placed_at() -> None:
    spec = job_spec(gpu_count=4, elasticity=Elasticity(min_shards=2, max_shards=8))
    spare = placement(3, "node-b").model_copy(update={"spare": True})
    place = Place("job-1", (placement(0), placement(1), placement(2), spare), "node-a")

    _placed, assignments = admit(
        place, spec, view(), attempt=1, term=1, port=29501, output_path="/o", resume_from=None, now=at(4)
    )

    assert [a.world_size for a in assignments] == [3, 3, 3, 3]


def test_admission_is_the_placement_then_one_assignment_per_shard_spares_included() -> None:
    spec = job_spec(entrypoint=None)
    spare = placement(2, "node-b").model_copy(update={"spare": True})
    place = Place("job-1", (placement(0), placement(1), spare), "node-a", degraded=True)

    placed, assignments = admit(
        place,
        spec,
        view(),
        attempt=3,
        term=7,
        port=29501,
        output_path="/data/checkpoints/job-1",
        resume_from="/data/checkpoints/job-1/checkpoint",
        now=at(4),
    )

    assert (placed.job_id, placed.attempt, placed.term, placed.occurred_at) == ("job-1", 3, 7, at(4))
    assert (placed.coordinator_node, placed.rendezvous_port, placed.degraded) == ("node-a", 29501, True)
    assert placed.placements == place.placements and placed.resume_from == "/data/checkpoints/job-1/checkpoint"
    assert [(a.shard_index, a.node_id, a.spare) for a in assignments] == [
        (0, "node-a", False),
        (1, "node-a", False),
        (2, "node-b", True),
    ]
    for assignment in assignments:
        assert (assignment.attempt, assignment.term, assignment.world_size) == (3, 7, 2)
        assert (assignment.master_addr, assignment.master_port) == ("node-a.cluster", 29501)
        assert assignment.workload.output_path == "/data/checkpoints/job-1"
        assert assignment.workload.resume_from == "/data/checkpoints/job-1/checkpoint"
        assert (assignment.workload.model_path, assignment.workload.max_steps) == (spec.model_path, spec.max_steps)
