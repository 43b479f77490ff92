from __future__ import annotations

import pytest

from shardyard.bus.codec import decode, encode, key_of, topic_of
from shardyard.bus.topics import (
    ALERTS,
    ASSIGNMENTS,
    BY_NAME,
    CATALOGUE,
    DEADLETTER,
    ELASTICITY,
    FAILURES,
    HEARTBEATS,
    LEADERSHIP,
    LIFECYCLE,
    LINKS,
    NODE_STATE,
    QUEUES,
    REDUNDANCY,
    SERVICES,
    SHARD_EVENTS,
    SUBMISSIONS,
    Topic,
)
from shardyard.errors import EventDecodeError
from shardyard.events import (
    AlertFiring,
    AlertResolved,
    AlertRule,
    AlertSeverity,
    CapacityRequested,
    Event,
    FailureCause,
    FieldError,
    JobAccepted,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPreempted,
    JobPreempting,
    JobReady,
    JobRecovering,
    JobRejected,
    JobResized,
    JobRunning,
    JobStraggling,
    JobSucceeded,
    JobUnschedulable,
    JobWaiting,
    LeaderElected,
    LeadershipClaimed,
    LinkMeasured,
    NodeDrain,
    NodeLost,
    PendingReason,
    QueuesConfigured,
    ReclaimCandidate,
    RedundancyChanged,
    RejectReason,
    ResizeReason,
    RevocationReason,
    RunningShard,
    ServiceReady,
    ShardCause,
    ShardCheckpointed,
    ShardPreempted,
    ShardRevocation,
    ShardStopRequest,
    StopReason,
    StragglerAction,
    StragglerKind,
    lease_of,
)
from shardyard.quotas import parse_queues
from tests.unit.builders import (
    assignment,
    at,
    completed,
    failed,
    heartbeat,
    job_spec,
    node_state,
    progress,
    relayed,
    scheduled,
    started,
)

SPEC = job_spec(job_id="job-7")
SAMPLES: list[tuple[Event, Topic, str]] = [
    (JobAccepted(occurred_at=at(1), job_id="job-7", spec=SPEC, source_offset="s/0/1"), LIFECYCLE, "job-7"),
    (
        JobRejected(
            occurred_at=at(1),
            job_id="job-7",
            reason=RejectReason.INVALID_VALUE,
            message="bad",
            errors=(FieldError(field="resource_requirements.gpu.count", problem="too small", input="0"),),
            source_offset="s/0/2",
        ),
        LIFECYCLE,
        "job-7",
    ),
    (JobReady(occurred_at=at(1), job_id="job-7", spec=SPEC), LIFECYCLE, "job-7"),
    (
        JobUnschedulable(
            occurred_at=at(1),
            job_id="job-7",
            reason=PendingReason.GPU_MODEL_MISMATCH,
            message="m",
            node_counts={"GPU model mismatch": 2},
        ),
        LIFECYCLE,
        "job-7",
    ),
    (scheduled("job-7", "node-a", "node-b"), LIFECYCLE, "job-7"),
    (JobRunning(occurred_at=at(1), job_id="job-7", attempt=1), LIFECYCLE, "job-7"),
    (
        JobSucceeded(occurred_at=at(1), job_id="job-7", attempt=1, final_loss=2.5, checkpoint_dir="/c"),
        LIFECYCLE,
        "job-7",
    ),
    (
        JobFailed(
            occurred_at=at(1),
            job_id="job-7",
            attempt=1,
            cause=FailureCause.NODE_LOST,
            message="m",
            causes=(ShardCause(shard_index=0, node_id="node-b", cause=FailureCause.NODE_LOST, message="m"),),
        ),
        LIFECYCLE,
        "job-7",
    ),
    (
        heartbeat("node-b", seq=3, running=(RunningShard(job_id="job-7", shard_index=0, attempt=1, pid=9),)),
        HEARTBEATS,
        "node-b",
    ),
    (node_state("node-b", allocated_gpus=(1,)), NODE_STATE, "node-b"),
    (NodeLost(occurred_at=at(1), node_id="node-b", last_heartbeat_at=at(0), silent_for_s=10.5), FAILURES, "node-b"),
    (assignment("job-7", node_id="node-b"), ASSIGNMENTS, "node-b"),
    (
        ShardRevocation(
            occurred_at=at(1),
            job_id="job-7",
            shard_index=0,
            node_id="node-b",
            attempt=1,
            term=1,
            reason=RevocationReason.CANCELLED,
        ),
        ASSIGNMENTS,
        "node-b",
    ),
    (started("job-7", node_id="node-b"), SHARD_EVENTS, "job-7"),
    (progress("job-7", node_id="node-b", syncs=2, allreduce_ms=1.5), SHARD_EVENTS, "job-7"),
    (completed("job-7", node_id="node-b"), SHARD_EVENTS, "job-7"),
    (failed("job-7", node_id="node-b", cause=FailureCause.COMM_ERROR), SHARD_EVENTS, "job-7"),
    (ServiceReady(occurred_at=at(1), service="scheduler", instance="s1", pid=7, host="h"), SERVICES, "scheduler"),
    (LeaderElected(occurred_at=at(1), service="scheduler", instance="s1", term=4), SERVICES, "scheduler"),
    (LeadershipClaimed(occurred_at=at(1), service="queue", instance="q1"), LEADERSHIP, "queue"),
    (
        JobWaiting(
            occurred_at=at(1),
            job_id="job-7",
            reason=PendingReason.WAITING_FOR_DEPENDENCY,
            message="m",
            waiting_for=("job-1",),
        ),
        LIFECYCLE,
        "job-7",
    ),
    (JobPreempting(occurred_at=at(1), job_id="job-7", attempt=1, by_job="vip", deadline_s=30), LIFECYCLE, "job-7"),
    (
        JobPreempted(
            occurred_at=at(1), job_id="job-7", attempt=1, by_job="vip", checkpoint_dir="/c", checkpoint_step=100
        ),
        LIFECYCLE,
        "job-7",
    ),
    (
        JobResized(
            occurred_at=at(1),
            job_id="job-7",
            attempt=1,
            from_shards=4,
            to_shards=2,
            reason=ResizeReason.SHRINK_FOR_PREEMPTION,
            by_job="vip",
        ),
        LIFECYCLE,
        "job-7",
    ),
    (
        JobStraggling(
            occurred_at=at(1),
            job_id="job-7",
            attempt=1,
            kind=StragglerKind.SLOW_NODE,
            action=StragglerAction.SWAP,
            shard_index=2,
            node_id="node-b",
            ratio=2.0,
            since=at(0),
        ),
        LIFECYCLE,
        "job-7",
    ),
    (JobCancelRequested(occurred_at=at(1), job_id="job-7"), LIFECYCLE, "job-7"),
    (JobCancelled(occurred_at=at(1), job_id="job-7", message="by user"), LIFECYCLE, "job-7"),
    (NodeDrain(occurred_at=at(1), node_id="node-b", draining=True), HEARTBEATS, "node-b"),
    (lease_of(heartbeat("node-b")), HEARTBEATS, "node-b"),
    (relayed("rack-1", heartbeat("node-c"), heartbeat("node-d")), HEARTBEATS, "node-c"),
    (
        ShardStopRequest(
            occurred_at=at(1),
            job_id="job-7",
            shard_index=0,
            node_id="node-b",
            attempt=1,
            term=1,
            reason=StopReason.PREEMPTED,
        ),
        ASSIGNMENTS,
        "node-b",
    ),
    (
        ShardPreempted(
            occurred_at=at(1), job_id="job-7", shard_index=0, attempt=1, node_id="node-b", step=100, checkpoint_dir="/c"
        ),
        SHARD_EVENTS,
        "job-7",
    ),
    (
        CapacityRequested(occurred_at=at(1), gpu_model="A100", min_tflops=35, gpus=3, jobs=("job-7",), waiting_s=40),
        ELASTICITY,
        "A100",
    ),
    (
        ReclaimCandidate(occurred_at=at(1), node_id="node-b", gpu_model="V100", gpus=2, idle_s=300),
        ELASTICITY,
        "node-b",
    ),
    (
        JobRecovering(
            occurred_at=at(1),
            job_id="job-7",
            attempt=1,
            cause=FailureCause.NODE_LOST,
            message="m",
            causes=(ShardCause(shard_index=1, node_id="node-b", cause=FailureCause.NODE_LOST, message="m"),),
            exclude_nodes=("node-b",),
            retry_at=at(2),
            retries_used=1,
            retries_left=2,
        ),
        LIFECYCLE,
        "job-7",
    ),
    (
        ShardCheckpointed(
            occurred_at=at(1), job_id="job-7", shard_index=0, attempt=1, node_id="node-b", step=100, checkpoint_dir="/c"
        ),
        SHARD_EVENTS,
        "job-7",
    ),
    (
        RedundancyChanged(
            occurred_at=at(1),
            ratio=0.1,
            previous_ratio=0.0,
            failure_rate=0.05,
            window_s=600,
            shard_attempts=40,
            shard_failures=2,
        ),
        REDUNDANCY,
        "policy",
    ),
    (
        QueuesConfigured(
            occurred_at=at(1),
            config=parse_queues("queues:\n  team-a: {gpus: {A100: 4}}\n"),
            version="0" * 64,
            source="/etc/shardyard/queues.yaml",
            published_by="queue-0",
        ),
        QUEUES,
        "queues",
    ),
    (
        AlertFiring(
            occurred_at=at(2),
            rule=AlertRule.NODE_SUSPECT,
            subject="node-b",
            severity=AlertSeverity.WARNING,
            summary="node-b is SUSPECT: silent for 3.2 s",
            value=3.2,
            threshold=0,
            since=at(1),
        ),
        ALERTS,
        "NODE_SUSPECT/node-b",
    ),
    (
        AlertResolved(
            occurred_at=at(3),
            rule=AlertRule.GPU_OVER_TEMPERATURE,
            subject="node-b/gpu1",
            severity=AlertSeverity.WARNING,
            summary="node-b GPU 1 back at 70 C",
            value=70.0,
            threshold=85,
            since=at(1),
        ),
        ALERTS,
        "GPU_OVER_TEMPERATURE/node-b/gpu1",
    ),
    (
        LinkMeasured(
            occurred_at=at(2),
            node_id="node-a",
            peer_id="node-b",
            rtt_median_ms=0.21,
            rtt_p90_ms=0.35,
            samples=5,
            bandwidth_bytes_per_s=1.2e9,
            burst_bytes=4 * 1024 * 1024,
        ),
        LINKS,
        "node-a|node-b",
    ),
]
IDS = [type(event).__name__ for event, _, _ in SAMPLES]


def _all_event_classes(cls: type[Event] = Event) -> set[type[Event]]:
    out: set[type[Event]] = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_all_event_classes(sub)}
    return out


@pytest.mark.parametrize(("event", "topic", "key"), SAMPLES, ids=IDS)
def test_round_trip_on_its_topic(event: Event, topic: Topic, key: str) -> None:
    assert topic_of(event) is topic
    assert decode(topic, encode(event)) == event


@pytest.mark.parametrize(("event", "topic", "key"), SAMPLES, ids=IDS)
def test_key_of(event: Event, topic: Topic, key: str) -> None:
    assert key_of(event) == key.encode()


def test_samples_cover_every_event_class() -> None:
    assert {type(event) for event, _, _ in SAMPLES} == _all_event_classes()


def test_topics_key_as_documented() -> None:
    node_keyed = {t.name for t in CATALOGUE if t.key == "node id"}
    job_keyed = {t.name for t in CATALOGUE if t.key == "job id"}

    assert node_keyed == {HEARTBEATS.name, NODE_STATE.name, ASSIGNMENTS.name, FAILURES.name}
    assert job_keyed == {LIFECYCLE.name, SHARD_EVENTS.name}


def test_topic_names_are_unique() -> None:
    names = [t.name for t in CATALOGUE]
    assert len(names) == len(set(names)) == len(BY_NAME)


def test_only_the_state_topics_are_compacted() -> None:
    assert [t.name for t in CATALOGUE if t.compacted] == [NODE_STATE.name, REDUNDANCY.name, LINKS.name, QUEUES.name]
    assert NODE_STATE.configs["cleanup.policy"] == "compact"
    assert all(t.configs["cleanup.policy"] == "delete" for t in CATALOGUE if not t.compacted)


@pytest.mark.parametrize(
    ("topic", "data"),
    [
        pytest.param(LIFECYCLE, b"not json", id="garbage"),
        pytest.param(LIFECYCLE, b"\xff\xfe", id="not-utf8"),
        pytest.param(LIFECYCLE, b"{}", id="empty-object"),
        pytest.param(LIFECYCLE, b'{"type": "job.exploded"}', id="unknown-type"),
        pytest.param(LIFECYCLE, encode(heartbeat()), id="heartbeat-on-lifecycle"),
        pytest.param(ASSIGNMENTS, encode(started()), id="shard-event-on-assignments"),
        pytest.param(HEARTBEATS, encode(node_state()), id="node-state-on-heartbeats"),
        pytest.param(SHARD_EVENTS, encode(assignment()), id="assignment-on-shard-events"),
        pytest.param(SUBMISSIONS, b"{}", id="raw-topic"),
        pytest.param(DEADLETTER, b"{}", id="dead-letter-topic"),
    ],
)
def test_decode_refuses(topic: Topic, data: bytes) -> None:
    with pytest.raises(EventDecodeError, match=topic.name):
        decode(topic, data)


def test_decode_refuses_extra_fields() -> None:
    data = encode(started()).replace(b'"pid":', b'"surprise":1,"pid":')

    with pytest.raises(EventDecodeError, match="surprise"):
        decode(SHARD_EVENTS, data)


def test_decode_refuses_naive_timestamps() -> None:
    data = encode(started()).replace(b'"2026-01-01T00:00:00Z"', b'"2026-01-01T00:00:00"')

    with pytest.raises(EventDecodeError, match="occurred_at"):
        decode(SHARD_EVENTS, data)
