"""A job that waits for its model or dataset (``WAITING_FOR_ARTIFACT``) names what it waits for: each missing path,
the nodes it could use that lack it (every node, or how many of how many, the first five by id) and where those nodes
mount it, in the message and in the verdict's ``missing`` (the event's ``missing_artifacts``)."""

from __future__ import annotations

import pytest

from shardyard.events import MissingArtifact, NodeStatus, PendingReason
from shardyard.mounts import host_path
from shardyard.placement import filters
from shardyard.placement.candidate import Candidate
from shardyard.placement.index import ClusterIndex
from shardyard.placement.model import NodeView, Policy
from tests.unit.builders import at
from tests.unit.placement_support import blocked, node, only, pending

MODEL, DATASET = "/data/models/gpt2", "/data/datasets/wikitext"
BARE: dict[str, str] = {}
ONLY_MODEL = {MODEL: "shared"}
MOUNTED = {"/data": "/srv/run/data"}


def missing(path: str, nodes: tuple[str, ...], lacking: int, of: int, **hosts: str) -> MissingArtifact:
    return MissingArtifact(path=path, nodes=nodes, lacking=lacking, of_nodes=of, host_paths=hosts)


CASES = [
    pytest.param(
        [node("a1", artifacts=BARE, mounts=MOUNTED), node("a2", artifacts=BARE, mounts=MOUNTED)],
        (
            missing(MODEL, ("a1", "a2"), 2, 2, a1="/srv/run/data/models/gpt2", a2="/srv/run/data/models/gpt2"),
            missing(
                DATASET, ("a1", "a2"), 2, 2, a1="/srv/run/data/datasets/wikitext", a2="/srv/run/data/datasets/wikitext"
            ),
        ),
        [
            f"{MODEL} absent on every node it could use (a1, a2): put it at /srv/run/data/models/gpt2",
            f"{DATASET} absent on every node it could use (a1, a2): put it at /srv/run/data/datasets/wikitext",
        ],
        id="both-on-every-node-with-the-host-path",
    ),
    pytest.param(
        [node("a1", artifacts=ONLY_MODEL), node("a2", artifacts=BARE), node("a3", artifacts=ONLY_MODEL, free_gpus=())],
        (
            missing(MODEL, ("a2",), 1, 3, a2=MODEL),
            missing(DATASET, ("a1", "a2", "a3"), 3, 3, a1=DATASET, a2=DATASET, a3=DATASET),
        ),
        [f"{MODEL} absent on 1 of the 3 nodes it could use (a2)", f"{DATASET} absent on every node it could use"],
        id="some-nodes-lack-one-and-no-mounts",
    ),
    pytest.param(
        [node(f"n{i:02}", artifacts=ONLY_MODEL) for i in range(12)],
        (missing(DATASET, ("n00", "n01", "n02", "n03", "n04"), 12, 12, **{f"n{i:02}": DATASET for i in range(5)}),),
        [f"{DATASET} absent on every node it could use (n00, n01, n02, n03, n04 and 7 more)"],
        id="many-nodes-capped-at-five",
    ),
    pytest.param(
        [
            node("a1", artifacts=ONLY_MODEL, mounts=MOUNTED),
            node("dead", artifacts=BARE, status=NodeStatus.LOST),
            node("drain", artifacts=BARE, draining=True),
            node("v1", "V100", artifacts=BARE),
        ],
        (missing(DATASET, ("a1",), 1, 1, a1="/srv/run/data/datasets/wikitext"),),
        [f"{DATASET} absent on every node it could use (a1): put it at /srv/run/data/datasets/wikitext"],
        id="only-nodes-it-could-use",
    ),
    pytest.param(
        [node("a1", artifacts=ONLY_MODEL, mounts={"/scratch": "/srv/scratch"})],
        (missing(DATASET, ("a1",), 1, 1),),
        [f"{DATASET} absent on every node it could use (a1): not under a mount of those nodes"],
        id="not-mounted-anywhere",
    ),
    pytest.param(
        [
            node("a1", artifacts=ONLY_MODEL, mounts=MOUNTED),
            node("a2", artifacts=ONLY_MODEL, mounts={"/data": "/mnt/d"}),
        ],
        (missing(DATASET, ("a1", "a2"), 2, 2, a1="/srv/run/data/datasets/wikitext", a2="/mnt/d/datasets/wikitext"),),
        [f"{DATASET} absent on every node it could use (a1, a2)"],
        id="nodes-that-mount-it-apart",
    ),
]


@pytest.mark.parametrize(("nodes", "expected", "said"), CASES)
def test_the_reason_names_each_missing_path_and_the_nodes_lacking_it(
    nodes: list[NodeView], expected: tuple[MissingArtifact, ...], said: list[str]
) -> None:
    verdict = blocked(only(nodes))

    assert verdict.reason is PendingReason.WAITING_FOR_ARTIFACT
    assert verdict.missing == expected
    for text in said:
        assert text in verdict.message
    assert verdict.message.startswith(f"0/{len(nodes)} nodes can take the gang")  # the counts come first, as ever


def test_the_paths_are_named_as_the_job_writes_them() -> None:
    job = pending(dataset_path="/data/datasets//wikitext/")

    verdict = blocked(only([node("a1", artifacts=ONLY_MODEL)], job))

    assert [m.path for m in verdict.missing] == ["/data/datasets//wikitext/"]


def test_one_path_named_twice_is_missing_once() -> None:
    job = pending(model_path=DATASET, dataset_path=DATASET)

    verdict = blocked(only([node("a1", artifacts=BARE)], job))

    assert [m.path for m in verdict.missing] == [DATASET]


@pytest.mark.parametrize(
    "nodes",
    [
        pytest.param([node("a1", artifacts=BARE, free_gpus=())], id="no-free-gpu-first"),
        pytest.param([node("a1", gpus=1), node("a2", artifacts=BARE, free_gpus=())], id="a-busy-node-lacks-them"),
        pytest.param([node("v1", "V100", artifacts=BARE)], id="wrong-gpu"),
    ],
)
def test_another_reason_carries_no_missing_artifacts(nodes: list[NodeView]) -> None:
    verdict = blocked(only(nodes))

    assert verdict.reason is not PendingReason.WAITING_FOR_ARTIFACT
    assert verdict.missing == ()
    assert "absent on" not in verdict.message


@pytest.mark.parametrize(
    "artifacts",
    [BARE, ONLY_MODEL, {DATASET: "local"}, {MODEL: "local", DATASET: "shared"}],
    ids=["none", "model", "dataset", "both"],
)
def test_the_paths_found_absent_are_what_fails_the_artifact_filter(artifacts: dict[str, str]) -> None:
    index = ClusterIndex([node("a1", artifacts=artifacts)], Policy())
    job = Candidate(pending(), index, at(1))
    slot = index.slots["a1"]

    absent = filters.absent_artifacts(slot, job)

    assert absent == [path for path in (MODEL, DATASET) if path not in artifacts]
    failing = filters.node_failing(slot, job)  # the node passes every other filter
    assert (failing.name if failing else None) == (filters.ARTIFACT if absent else None)


@pytest.mark.parametrize(
    ("job_path", "mounts", "local"),
    [
        pytest.param("/data/models/x", {"/data": "/srv/d"}, "/srv/d/models/x", id="under-a-mount"),
        pytest.param("/data", {"/data": "/srv/d"}, "/srv/d", id="the-mount-itself"),
        pytest.param("/data/m/x", {"/data": "/srv/d", "/data/m": "/fast/m"}, "/fast/m/x", id="longest-prefix"),
        pytest.param("/database/x", {"/data": "/srv/d"}, None, id="whole-components-only"),
        pytest.param("/data/models/x", {}, "/data/models/x", id="no-mounts-as-it-is"),
    ],
)
def test_a_job_path_lies_where_the_nodes_mounts_put_it(job_path: str, mounts: dict[str, str], local: str) -> None:
    assert host_path(job_path, mounts) == local


def test_a_path_no_agent_has_looked_for_yet_is_not_waited_for() -> None:
    """A new job's paths are absent from every node's report until its agent has looked (within a heartbeat of the
    job's acceptance): the verdict names no missing path then, and says why."""
    unlooked = [node("a1", artifacts=BARE, absent_artifacts=frozenset()), node("a2", artifacts=ONLY_MODEL)]

    decision = blocked(only(unlooked))

    assert decision.reason is PendingReason.WAITING_FOR_ARTIFACT
    assert decision.missing == (missing(DATASET, ("a2",), 1, 2, a2=DATASET).model_copy(update={"unchecked": 1}),)
    looked_for_none = blocked(only([node("a1", artifacts=BARE, absent_artifacts=frozenset())]))
    assert looked_for_none.missing == ()
    assert "agents have not reported on its model and dataset yet" in looked_for_none.message
