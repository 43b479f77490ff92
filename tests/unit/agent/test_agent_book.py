from __future__ import annotations

from pathlib import Path

import pytest

from shardyard.events import (
    FailureCause,
    RevocationReason,
    RunningShard,
    ShardAssignment,
    ShardCompleted,
    ShardFailed,
    ShardPreempted,
    ShardRevocation,
    ShardStopRequest,
    StopReason,
)
from shardyard.node_agent.book import AgentBook, Verdict, key_of
from shardyard.node_agent.environment import RunnerOptions, ShardPaths, shard_env
from tests.unit.builders import assignment, at, workload


def revocation(shard_index: int = 0, **overrides: object) -> ShardRevocation:
    fields: dict[str, object] = {
        "occurred_at": at(1),
        "job_id": "job-1",
        "shard_index": shard_index,
        "node_id": "node-a",
        "attempt": 1,
        "term": 1,
        "reason": RevocationReason.JOB_FAILED,
    }
    return ShardRevocation(**{**fields, **overrides})  # type: ignore[arg-type]


def stop_request(shard_index: int = 0, **overrides: object) -> ShardStopRequest:
    fields: dict[str, object] = {
        "occurred_at": at(1),
        "job_id": "job-1",
        "shard_index": shard_index,
        "node_id": "node-a",
        "attempt": 1,
        "term": 1,
        "reason": StopReason.PREEMPTED,
    }
    return ShardStopRequest(**{**fields, **overrides})


def verdicts(*assignments: ShardAssignment) -> list[Verdict]:
    book = AgentBook("node-a")
    return [book.on_assignment(a) for a in assignments]


@pytest.mark.parametrize(
    ("sequence", "expected"),
    [
        pytest.param([assignment()], [Verdict.LAUNCH], id="launch"),
        pytest.param([assignment(node_id="node-b")], [Verdict.NOT_MINE], id="not-mine"),
        pytest.param([assignment(), assignment()], [Verdict.LAUNCH, Verdict.DUPLICATE], id="duplicate"),
        pytest.param(
            [assignment(), assignment(shard_index=1)], [Verdict.LAUNCH, Verdict.LAUNCH], id="two-shards-of-a-gang"
        ),
        pytest.param([assignment(), assignment(attempt=2)], [Verdict.LAUNCH, Verdict.LAUNCH], id="new-attempt"),
        pytest.param(
            [assignment(term=2), assignment(shard_index=1, term=1)], [Verdict.LAUNCH, Verdict.STALE_TERM], id="stale"
        ),
        pytest.param([assignment(term=1), assignment(term=2)], [Verdict.LAUNCH, Verdict.DUPLICATE], id="newer-term"),
        pytest.param(
            [assignment(node_id="node-b", term=9), assignment(term=1)],
            [Verdict.NOT_MINE, Verdict.LAUNCH],
            id="others-terms-do-not-count",
        ),
    ],
)
def test_on_assignment(sequence: list[ShardAssignment], expected: list[Verdict]) -> None:
    assert verdicts(*sequence) == expected


def test_finished_shard_is_not_launched_again() -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())
    book.finished(key_of(assignment()), 0, now=at(2), final=None, message="")

    assert book.on_assignment(assignment()) is Verdict.DUPLICATE


@pytest.mark.parametrize(
    ("event", "stops"),
    [
        pytest.param(revocation(), True, id="ours-running"),
        pytest.param(revocation(node_id="node-b"), False, id="other-node"),
        pytest.param(revocation(shard_index=1), False, id="not-running"),
        pytest.param(revocation(attempt=2), False, id="other-attempt"),
        pytest.param(revocation(term=0), False, id="older-term"),
    ],
)
def test_on_revocation(event: ShardRevocation, stops: bool) -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())

    assert book.on_revocation(event) == (("job-1", 0, 1) if stops else None)


@pytest.mark.parametrize(
    ("returncode", "cause", "kind"),
    [
        pytest.param(3, FailureCause.USER_ERROR, ShardFailed, id="exit-3"),
        pytest.param(4, FailureCause.COMM_ERROR, ShardFailed, id="exit-4"),
        pytest.param(1, FailureCause.PROCESS_EXIT, ShardFailed, id="exit-1"),
        pytest.param(6, FailureCause.OOM, ShardFailed, id="oom"),
        pytest.param(7, FailureCause.GPU_FAULT, ShardFailed, id="gpu-fault"),
        pytest.param(8, FailureCause.SYNC_TIMEOUT, ShardFailed, id="sync-timeout"),
        pytest.param(-9, FailureCause.KILLED, ShardFailed, id="sigkill"),
        pytest.param(137, FailureCause.KILLED, ShardFailed, id="shell-sigkill"),
        pytest.param(0, None, ShardCompleted, id="exit-0"),
    ],
)
def test_finished_by_exit_code(returncode: int, cause: FailureCause | None, kind: type) -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment(shard_index=1, attempt=2))

    event = book.finished(("job-1", 1, 2), returncode, now=at(9), final=None, message=f"exit code {returncode}")

    assert isinstance(event, kind)
    assert (event.job_id, event.shard_index, event.attempt, event.node_id, event.occurred_at) == (  # type: ignore[union-attr]
        "job-1",
        1,
        2,
        "node-a",
        at(9),
    )
    if isinstance(event, ShardFailed):
        assert (event.cause, event.exit_code, event.message) == (cause, returncode, f"exit code {returncode}")
    assert book.running == {}


def test_completed_carries_the_final_report() -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment(workload=workload(output_path="/data/checkpoints/x")))
    final = {"kind": "finished", "final_loss": 2.25, "steps": 300, "checkpoint_dir": "/srv/ckpt"}

    event = book.finished(("job-1", 0, 1), 0, now=at(9), final=final, message="")

    assert isinstance(event, ShardCompleted)
    assert (event.final_loss, event.steps, event.checkpoint_dir) == (2.25, 300, "/data/checkpoints/x")


def test_completed_without_a_report_has_no_loss() -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())

    event = book.finished(("job-1", 0, 1), 0, now=at(9), final={"final_loss": "nan?"}, message="")

    assert isinstance(event, ShardCompleted) and (event.final_loss, event.steps) == (None, None)


def test_launch_error_is_reported_with_its_cause() -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())

    event = book.finished(
        ("job-1", 0, 1), None, now=at(9), final=None, message="no model", cause=FailureCause.MISSING_ARTIFACT
    )

    assert isinstance(event, ShardFailed)
    assert (event.cause, event.exit_code) == (FailureCause.MISSING_ARTIFACT, None)


def test_revoked_shard_reports_nothing() -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())
    book.on_revocation(revocation())

    assert book.finished(("job-1", 0, 1), -15, now=at(9), final=None, message="") is None
    assert (book.running, book.revoked) == ({}, set())


def test_running_shards_and_gpu_utilisation() -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment(shard_index=1, gpu_indices=(3,)))
    book.on_assignment(assignment(shard_index=0, gpu_indices=(2,)))
    book.utilization[("job-1", 0, 1)] = 0.8

    assert book.running_shards({("job-1", 1, 1): 42}) == (
        RunningShard(job_id="job-1", shard_index=0, attempt=1, pid=None),
        RunningShard(job_id="job-1", shard_index=1, attempt=1, pid=42),
    )
    assert book.gpu_utilization() == {2: 0.8, 3: 0.01}


def test_paths_go_through_the_mounts() -> None:
    book = AgentBook("node-a")

    paths = book.paths(assignment(), {"/data": "/srv/data"})

    assert paths == ShardPaths(
        model=Path("/srv/data/models/gpt2"),
        dataset=Path("/srv/data/datasets/wikitext"),
        output=Path("/srv/data/checkpoints/job-1"),
    )


def test_shard_env() -> None:
    # The agent's own environment, less the cluster secret's path (the agent's, never the job's), and the runtime's.
    shard = assignment(
        shard_index=1,
        world_size=2,
        gpu_indices=(3,),
        attempt=2,
        master_addr="node-a.cluster",
        master_port=29501,
        workload=workload(sync_interval=10, max_steps=40, batch_size=4, seq_len=32, lr=0.01, seed=7),
    )
    paths = ShardPaths(model=Path("/m"), dataset=Path("/d"), output=Path("/o"))

    env = shard_env(
        shard, paths, base_env={"PATH": "/usr/bin", "RANK": "stale", "SHARDYARD_CLUSTER_SECRET_FILE": "/run/secret"}
    )

    assert env == {
        "PATH": "/usr/bin",
        "RANK": "1",
        "LOCAL_RANK": "3",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "node-a.cluster",
        "MASTER_PORT": "29501",
        "OMP_NUM_THREADS": "1",
        "SHARDYARD_JOB_ID": "job-1",
        "SHARDYARD_NODE_ID": "node-a",
        "SHARDYARD_ATTEMPT": "2",
        "SHARDYARD_MODEL_DIR": "/m",
        "SHARDYARD_DATASET_DIR": "/d",
        "SHARDYARD_OUTPUT_DIR": "/o",
        "SHARDYARD_SYNC_INTERVAL": "10",
        "SHARDYARD_MAX_STEPS": "40",
        "SHARDYARD_BATCH_SIZE": "4",
        "SHARDYARD_SEQ_LEN": "32",
        "SHARDYARD_LR": "0.01",
        "SHARDYARD_SEED": "7",
        "SHARDYARD_CHECKPOINT_EVERY": "1",
        "SHARDYARD_SYNC_TIMEOUT_S": "30.0",
        "SHARDYARD_SLOW_SYNC_FACTOR": "3.0",
        "SHARDYARD_STEP_LOG_EVERY_S": "1.0",
        "SHARDYARD_NOTICE_SIGNAL": "SIGUSR1",
        "SHARDYARD_NOTICE_S": "30.0",
    }


def test_shard_env_carries_the_node_runner_options() -> None:
    paths = ShardPaths(model=Path("/m"), dataset=Path("/d"), output=Path("/o"))
    options = RunnerOptions(checkpoint_every=0, sync_timeout_s=12.5, slow_sync_factor=4.0, step_log_every_s=0.0)

    env = shard_env(assignment(), paths, base_env={"SHARDYARD_CHECKPOINT_EVERY": "9"}, options=options)

    assert (env["SHARDYARD_CHECKPOINT_EVERY"], env["SHARDYARD_SYNC_TIMEOUT_S"], env["SHARDYARD_SLOW_SYNC_FACTOR"]) == (
        "0",
        "12.5",
        "4.0",
    )
    assert env["SHARDYARD_STEP_LOG_EVERY_S"] == "0.0"


def test_shard_missing_paths(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    paths = ShardPaths(model=tmp_path / "model", dataset=tmp_path / "absent", output=tmp_path / "out")

    assert paths.missing() == [f"dataset {tmp_path / 'absent'}"]


@pytest.mark.parametrize(
    ("event", "stops"),
    [
        pytest.param(stop_request(), True, id="ours-running"),
        pytest.param(stop_request(term=2), True, id="newer-term"),
        pytest.param(stop_request(node_id="node-b"), False, id="other-node"),
        pytest.param(stop_request(shard_index=1), False, id="not-running"),
        pytest.param(stop_request(attempt=2), False, id="other-attempt"),
        pytest.param(stop_request(term=0), False, id="older-term"),
    ],
)
def test_on_stop_request(event: ShardStopRequest, stops: bool) -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())

    assert book.on_stop_request(event) == (("job-1", 0, 1) if stops else None)


def test_stop_request_is_refused_after_a_newer_term_was_seen() -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())
    book.on_assignment(assignment(job_id="job-2", term=3))

    assert book.on_stop_request(stop_request(term=2)) is None
    assert book.on_stop_request(stop_request(term=3)) == ("job-1", 0, 1)


@pytest.mark.parametrize(
    "first",
    [pytest.param(stop_request(), id="redelivered-stop"), pytest.param(revocation(), id="already-revoked")],
)
def test_a_shard_being_stopped_is_not_signalled_again(first: ShardStopRequest | ShardRevocation) -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())
    if isinstance(first, ShardStopRequest):
        book.on_stop_request(first)
    else:
        book.on_revocation(first)

    assert book.on_stop_request(stop_request()) is None


@pytest.mark.parametrize(
    ("final", "step"),
    [
        pytest.param({"kind": "preempted", "step": 120, "checkpoint_dir": "/srv/out/checkpoint"}, 120, id="reported"),
        pytest.param(None, None, id="no-report"),
        pytest.param({"kind": "finished", "steps": 300}, None, id="other-report"),
        pytest.param({"kind": "preempted", "step": "120"}, None, id="bad-step"),
    ],
)
def test_preempted_exit_reports_the_step_and_the_job_checkpoint_path(
    final: dict[str, object] | None, step: int | None
) -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment(workload=workload(output_path="/data/checkpoints/job-1")))
    book.on_stop_request(stop_request())

    event = book.finished(("job-1", 0, 1), 75, now=at(9), final=final, message="exit code 75")

    assert event == ShardPreempted(
        event_id=event.event_id,  # type: ignore[union-attr]
        occurred_at=at(9),
        job_id="job-1",
        shard_index=0,
        attempt=1,
        node_id="node-a",
        step=step,
        checkpoint_dir="/data/checkpoints/job-1/checkpoint",
    )
    assert (book.running, book.stopping) == ({}, set())


@pytest.mark.parametrize(
    ("returncode", "kind"),
    [
        pytest.param(0, ShardCompleted, id="finished-before-its-next-sync"),
        pytest.param(4, ShardFailed, id="failed-while-stopping"),
    ],
)
def test_a_shard_asked_to_stop_may_still_end_otherwise(returncode: int, kind: type) -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())
    book.on_stop_request(stop_request())

    assert isinstance(book.finished(("job-1", 0, 1), returncode, now=at(9), final=None, message=""), kind)


def test_revoked_while_stopping_reports_nothing() -> None:
    book = AgentBook("node-a")
    book.on_assignment(assignment())
    book.on_stop_request(stop_request())
    book.on_revocation(revocation())

    assert book.finished(("job-1", 0, 1), 75, now=at(9), final=None, message="") is None


def test_resume_checkpoint_goes_through_the_mounts_and_into_the_environment(tmp_path: Path) -> None:
    book = AgentBook("node-a")
    shard = assignment(workload=workload(resume_from="/data/checkpoints/job-1/checkpoint"))

    paths = book.paths(shard, {"/data": "/srv/data"})
    env = shard_env(shard, paths, base_env={})

    assert paths.resume == Path("/srv/data/checkpoints/job-1/checkpoint")
    assert env["SHARDYARD_RESUME_DIR"] == "/srv/data/checkpoints/job-1/checkpoint"
    assert "SHARDYARD_RESUME_DIR" not in shard_env(assignment(), book.paths(assignment(), {}), base_env={})


def test_a_missing_resume_checkpoint_is_a_missing_artifact(tmp_path: Path) -> None:
    for name in ("model", "dataset"):
        (tmp_path / name).mkdir()
    paths = ShardPaths(
        model=tmp_path / "model", dataset=tmp_path / "dataset", output=tmp_path / "out", resume=tmp_path / "ckpt"
    )

    assert paths.missing() == [f"checkpoint {tmp_path / 'ckpt'}"]


def test_the_agents_own_settings_stay_its_own_but_the_test_slow_down_hook_reaches_its_shards() -> None:
    from shardyard.node_agent.environment import agent_base_env

    environ = {"PATH": "/bin", "SHARDYARD_BOOTSTRAP": "b:9092", "SHARDYARD_TEST_SLOWDOWN_DIR": "/tmp/slow"}
    assert agent_base_env(environ) == {"PATH": "/bin", "SHARDYARD_TEST_SLOWDOWN_DIR": "/tmp/slow"}
