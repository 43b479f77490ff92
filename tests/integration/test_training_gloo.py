"""Real multi-process runs of ``python -m shardyard.training.runner`` over gloo on localhost (no broker), on the CPU
even where a GPU is present (``SHARDYARD_DEVICE=cpu``: two ranks need not find two GPUs)."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardyard.training import exitcodes
from shardyard.training.artifacts import DemoArtifacts, create_demo_artifacts
from shardyard.training.checkpoint import OPTIMIZER_FILE
from shardyard.training.config import PEER_STATE_DIR_ENV
from shardyard.training.exitcodes import ExitCause, classify_exit
from shardyard.training.model import TinyGPTConfig, load_pretrained
from shardyard.training.runner import TERMINATED_EXIT
from tests.support.runners import Launcher, Shard, runners, train_env, until
from tests.support.runners import wait_exit as _wait

# Smaller than the default TinyGPT so that 300 steps take a few seconds on 2 CPU cores.
TEST_MODEL = TinyGPTConfig(n_positions=64, n_embd=32, n_layer=1, n_head=2)
RUN_DEADLINE_S = 120.0


def _train_env(artifacts: DemoArtifacts, output_dir: Path, **extra: str) -> dict[str, str]:
    return train_env(artifacts, output_dir, **{"SHARDYARD_DEVICE": "cpu", **extra})


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> DemoArtifacts:
    return create_demo_artifacts(tmp_path_factory.mktemp("data"), seed=0, model_config=TEST_MODEL)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launcher]:
    with runners(tmp_path) as start:
        yield start


def test_two_shards_train_sync_and_save(artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path) -> None:
    output_dir = tmp_path / "out" / "final"
    t0 = time.monotonic()
    shards = launch(2, _train_env(artifacts, output_dir))
    deadline = t0 + RUN_DEADLINE_S
    rcs = [_wait(shard, deadline - time.monotonic()) for shard in shards]
    elapsed = time.monotonic() - t0
    assert rcs == [exitcodes.OK, exitcodes.OK], "\n".join(s.stderr() for s in shards)

    for shard in shards:
        kinds = [line["kind"] for line in shard.lines]
        middle = {"progress", "checkpointed"} if shard.rank == 0 else {"progress"}
        assert kinds[0] == "started" and kinds[-1] == "finished" and set(kinds[1:-1]) == middle
        assert shard.lines[0] == {"kind": "started", "world_size": 2, "rank": shard.rank}
        progress = shard.progress()
        assert progress[-1]["syncs"] >= 3
        sync_lines = [p for p in progress if p["step"] in (100, 200, 300)]
        assert [p["syncs"] for p in sync_lines] == [1, 2, 3]  # forced lines on every sync
        assert all(p["allreduce_bytes"] > 0 for p in sync_lines)
        assert progress[-1]["loss"] < progress[0]["loss"]
        assert progress[-1]["step"] == 300
        finished = shard.lines[-1]
        assert finished["steps"] == 300
        assert finished["checkpoint_dir"] == (str(output_dir) if shard.rank == 0 else None)
    # Rank 0 checkpointed at every sync but the last (the final save is the output); the last checkpoint is kept
    # inside the output, for a gang re-formed after this one finished unseen.
    assert [line["step"] for line in shards[0].of("checkpointed")] == [100, 200]
    assert json.loads((output_dir / "checkpoint" / "state.json").read_text())["step"] == 200

    assert load_pretrained(output_dir).config == TEST_MODEL
    rank0 = shards[0]
    train_s = rank0.arrived[-1] - rank0.arrived[0]  # "started" (after the rendezvous) .. "finished"
    print(
        f"\n2 shards x 300 steps: {elapsed:.2f} s wall from Popen to exit; rank 0 start-up"
        f" {rank0.arrived[0] - t0:.2f} s, training {train_s:.2f} s = {1000 * train_s / 300:.1f} ms/step"
    )


def test_a_stop_signal_to_one_shard_stops_both_at_one_sync_and_the_gang_resumes(
    artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path
) -> None:
    output_dir = tmp_path / "out"
    checkpoint = output_dir / "checkpoint"
    env = _train_env(artifacts, output_dir, SHARDYARD_MAX_STEPS="1000000", SHARDYARD_SYNC_INTERVAL="10")
    rank0, rank1 = launch(2, env)
    until(lambda: any(p["step"] >= 30 for p in rank1.progress()), 60, "rank 1 at step 30")
    seen = max(p["step"] for p in rank1.progress())
    rank1.proc.send_signal(signal.SIGUSR1)  # only rank 1 is asked; rank 0 learns it at the next sync

    rcs = [_wait(shard, 60) for shard in (rank0, rank1)]

    assert rcs == [exitcodes.PREEMPTED, exitcodes.PREEMPTED], "\n".join(s.stderr() for s in (rank0, rank1))
    assert classify_exit(exitcodes.PREEMPTED) is ExitCause.PREEMPTED
    ends = [shard.lines[-1] for shard in (rank0, rank1)]
    stop_step = ends[0]["step"]
    assert ends == [
        {"kind": "preempted", "step": stop_step, "checkpoint_dir": str(checkpoint)},
        {"kind": "preempted", "step": stop_step, "checkpoint_dir": None},
    ]
    assert stop_step % 10 == 0 and stop_step > seen
    assert [shard.progress()[-1]["step"] for shard in (rank0, rank1)] == [stop_step, stop_step]
    state = json.loads((checkpoint / "state.json").read_text())
    assert (state["step"], state["world_size"], state["sync_interval"]) == (stop_step, 2, 10)
    assert load_pretrained(checkpoint).config == TEST_MODEL
    assert (checkpoint / OPTIMIZER_FILE).is_file()
    first_loss = rank0.progress()[0]["loss"]

    max_steps = stop_step + 100
    resumed = launch(
        2,
        _train_env(
            artifacts,
            output_dir,
            SHARDYARD_MAX_STEPS=str(max_steps),
            SHARDYARD_SYNC_INTERVAL="10",
            SHARDYARD_RESUME_DIR=str(checkpoint),
        ),
    )
    rcs = [_wait(shard, RUN_DEADLINE_S) for shard in resumed]

    assert rcs == [exitcodes.OK, exitcodes.OK], "\n".join(s.stderr() for s in resumed)
    for shard in resumed:
        progress = shard.progress()
        assert progress[0]["step"] == stop_step + 1 and progress[-1]["step"] == max_steps
        losses = [p["loss"] for p in progress]
        assert all(loss is not None and math.isfinite(loss) for loss in losses)
        # The weights were restored (the first loss is far below a fresh model's) and training went on improving.
        assert losses[0] < first_loss - 0.5 and losses[-1] < first_loss - 0.5
        finished = shard.lines[-1]
        assert finished["kind"] == "finished" and finished["steps"] == max_steps
        assert math.isfinite(finished["final_loss"]) and finished["final_loss"] < first_loss - 0.5
    assert load_pretrained(output_dir).config == TEST_MODEL
    print(
        f"\nstopped at step {stop_step} (signal after step {seen}); first loss {first_loss:.3f}, resumed"
        f" {resumed[0].progress()[0]['loss']:.3f} -> {resumed[0].progress()[-1]['loss']:.3f} at step {max_steps}"
    )


def test_missing_model_dir_exits_user_error(artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path) -> None:
    env = _train_env(artifacts, tmp_path / "out", SHARDYARD_MODEL_DIR=str(tmp_path / "no-such-model"))
    (shard,) = launch(2, env, ranks=[0])  # its peer never starts: the input check comes before the rendezvous
    assert _wait(shard, 60) == exitcodes.USER_ERROR
    assert "does not exist" in shard.stderr()
    assert shard.lines == []


def test_sigterm_ends_a_shard_promptly_and_its_peer_exits_comm_error(
    artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path
) -> None:
    env = _train_env(artifacts, tmp_path / "out", SHARDYARD_MAX_STEPS="1000000", SHARDYARD_SYNC_INTERVAL="10")
    rank0, rank1 = launch(2, env)
    for shard in (rank0, rank1):
        assert shard.got_line.wait(timeout=60), f"rank {shard.rank} never reported:\n{shard.stderr()}"
    t_kill = time.monotonic()
    rank1.proc.send_signal(signal.SIGTERM)
    assert _wait(rank1, 10) == TERMINATED_EXIT, rank1.stderr()
    assert classify_exit(rank1.proc.returncode) is ExitCause.KILLED
    assert "terminated after step" in rank1.stderr()
    assert _wait(rank0, 30) == exitcodes.COMM_ERROR, rank0.stderr()
    assert classify_exit(rank0.proc.returncode) is ExitCause.COMM_ERROR
    assert "communication error" in rank0.stderr()
    print(f"\npeer exited COMM_ERROR {time.monotonic() - t_kill:.2f} s after SIGTERM")


def test_rendezvous_timeout_exits_comm_error(artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path) -> None:
    env = _train_env(artifacts, tmp_path / "out", SHARDYARD_DIST_TIMEOUT_S="1")
    (shard,) = launch(2, env, ranks=[0])  # rank 1 never shows up
    assert _wait(shard, 60) == exitcodes.COMM_ERROR, shard.stderr()
    assert "init_process_group" in shard.stderr()
    assert shard.lines == []


def test_a_failed_shard_exits_with_its_cause_whatever_the_interpreters_teardown_would_do(
    artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path
) -> None:
    """gloo can abort the process while the interpreter tears down a process group that a failed collective left
    behind ("terminate called without an active exception", seen after a peer's death): the shard then dies by
    SIGABRT, KILLED to its agent, not the COMM_ERROR it printed. A failed shard ends without that teardown: here the
    teardown is made to abort for sure (an exit hook in the survivor) and the survivor still exits COMM_ERROR."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text("import atexit\nimport os\n\natexit.register(os.abort)\n")
    path = os.pathsep.join(p for p in (str(hooks), os.environ.get("PYTHONPATH", "")) if p)
    rank0, rank1 = launch(2, _sync_env(artifacts, tmp_path / "out"), rank_env={0: {"PYTHONPATH": path}})
    until(lambda: len(rank0.sync_lines()) >= 2, 60, "two syncs")
    rank1.proc.kill()

    assert _wait(rank0, 60) == exitcodes.COMM_ERROR, rank0.stderr()
    assert "communication error" in rank0.stderr()


def _sync_env(artifacts: DemoArtifacts, output_dir: Path, **extra: str) -> dict[str, str]:
    return _train_env(artifacts, output_dir, SHARDYARD_MAX_STEPS="1000000", SHARDYARD_SYNC_INTERVAL="10", **extra)


def test_a_checkpoint_at_every_sync_survives_a_killed_rank_and_the_gang_resumes_from_it(
    artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path
) -> None:
    output_dir = tmp_path / "out"
    checkpoint = output_dir / "checkpoint"
    rank0, rank1 = launch(2, _sync_env(artifacts, output_dir, SHARDYARD_CHECKPOINT_EVERY="1"))
    until(lambda: len(rank0.of("checkpointed")) >= 5, 60, "five checkpoints")
    rank1.proc.kill()  # SIGKILL: no goodbye; rank 0 finds out at its next sync

    assert _wait(rank1, 10) == -signal.SIGKILL
    assert _wait(rank0, 60) == exitcodes.COMM_ERROR, rank0.stderr()

    syncs = rank0.sync_lines()
    periodic = rank0.of("checkpointed")
    assert [c["step"] for c in periodic] == [s["step"] for s in syncs]  # one per sync, in order, none lost
    assert all(c["checkpoint_dir"] == str(checkpoint) for c in periodic)
    last = syncs[-1]["step"]
    state = json.loads((checkpoint / "state.json").read_text())
    assert state["step"] == last and last % 10 == 0
    assert load_pretrained(checkpoint).config == TEST_MODEL
    assert sorted(p.name for p in output_dir.iterdir()) == [".checkpoint.lock", "checkpoint"]  # no temp or old copies
    snapshot = sorted(c["snapshot_ms"] for c in periodic)
    write = sorted(c["write_ms"] for c in periodic)

    resumed = launch(
        2,
        _train_env(
            artifacts,
            output_dir,
            SHARDYARD_MAX_STEPS=str(last + 30),
            SHARDYARD_SYNC_INTERVAL="10",
            SHARDYARD_RESUME_DIR=str(checkpoint),
        ),
    )
    rcs = [_wait(shard, RUN_DEADLINE_S) for shard in resumed]

    assert rcs == [exitcodes.OK, exitcodes.OK], "\n".join(s.stderr() for s in resumed)
    for shard in resumed:
        assert shard.progress()[0]["step"] == last + 1 and shard.lines[-1]["steps"] == last + 30
    print(
        f"\nrank 1 killed after {len(periodic)} checkpoints; resumed from step {last}; checkpoint cost (median,"
        f" test model): {snapshot[len(snapshot) // 2]:.2f} ms snapshot on the training thread,"
        f" {write[len(write) // 2]:.2f} ms write in the background"
    )


def _peer_run(sync_interval: int) -> dict[str, str]:
    return {
        "SHARDYARD_SYNC_INTERVAL": str(sync_interval),
        "SHARDYARD_CHECKPOINT_EVERY": "0",
        "SHARDYARD_SLOW_SYNC_FACTOR": "1000",
    }


def _resumes_as_if_nothing_failed(
    artifacts: DemoArtifacts,
    launch: Launcher,
    tmp_path: Path,
    *,
    sync_interval: int,
    survivor: int,
    nodes: dict[str, Path],
    resume_step: int,
) -> None:
    """The re-formed gang (the survivor on its node ``a``, the lost rank on a ``new`` one) resumes from the state the
    survivor kept at ``resume_step`` and ends bit for bit as the same run without the fault."""
    lost = 1 - survivor
    output_dir = tmp_path / "out"
    max_steps = resume_step + 30
    replaced = {survivor: "a", lost: "new"}
    run = _peer_run(sync_interval)
    resumed = launch(
        2,
        _train_env(artifacts, output_dir, SHARDYARD_MAX_STEPS=str(max_steps), SHARDYARD_ATTEMPT="2", **run),
        rank_env={rank: {PEER_STATE_DIR_ENV: str(nodes[node])} for rank, node in replaced.items()},
    )
    reference = launch(2, _train_env(artifacts, tmp_path / "reference", SHARDYARD_MAX_STEPS=str(max_steps), **run))
    rcs = [_wait(shard, RUN_DEADLINE_S) for shard in [*resumed, *reference]]

    assert rcs == [exitcodes.OK] * 4, "\n".join(s.stderr() for s in [*resumed, *reference])
    state = f"resuming from its peers' state of step {resume_step} (attempt 1; this rank's from"
    assert f"{state} this node)" in resumed[survivor].stderr()
    assert f"{state} rank {survivor})" in resumed[lost].stderr()
    for shard in resumed:
        assert shard.progress()[0]["step"] == resume_step + 1 and shard.lines[-1]["steps"] == max_steps
    # Every rank resumed with its own optimizer state and the synced weights: the run ends bit for bit as the
    # reference does (the model has no dropout; the batches follow the step).
    assert [s.lines[-1]["final_loss"] for s in resumed] == [s.lines[-1]["final_loss"] for s in reference]
    assert (output_dir / "model.safetensors").read_bytes() == (
        tmp_path / "reference" / "model.safetensors"
    ).read_bytes()


def _kept_state(state_file: Path, survivor: Shard, sync_interval: int) -> dict[str, Any]:
    """The state the survivor kept (its ``state.json``): of its last sync, and with both ranks' optimizer state."""
    kept: dict[str, Any] = json.loads(state_file.read_text())
    if sync_interval == 1:  # every step syncs; progress lines are rate-limited, so the last one may lag
        assert kept["step"] >= survivor.progress()[-1]["step"]
    else:
        assert kept["step"] == survivor.sync_lines()[-1]["step"]
    assert (kept["ranks"], kept["attempt"]) == ([0, 1], 1)  # the survivor holds both ranks' optimizer state
    return kept


def _cpu_ticks(pid: int) -> int:
    """User plus system CPU time of a process, in clock ticks (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _idle_for(pid: int, quiet_s: float) -> Callable[[], bool]:
    """A condition: the process used no CPU for ``quiet_s`` (it is blocked)."""
    last = [_cpu_ticks(pid), time.monotonic()]

    def idle() -> bool:
        ticks = _cpu_ticks(pid)
        if ticks != last[0]:
            last[:] = [ticks, time.monotonic()]
        return time.monotonic() - last[1] >= quiet_s

    return idle


SYNC_CASES = pytest.mark.parametrize(
    ("sync_interval", "lost"),
    [(10, 1), (1, 0)],
    ids=["local-sgd-rank-1-lost", "gradient-averaging-rank-0-lost"],
)


@SYNC_CASES
def test_a_gang_that_loses_a_rank_resumes_from_its_survivors_state_as_if_nothing_failed(
    artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path, sync_interval: int, lost: int
) -> None:
    """No periodic checkpoint at all: the survivor keeps the gang's state of its last sync on its node; the re-formed
    gang (the survivor on its node, the lost rank on a new one) continues from it and ends exactly where the same
    run without the fault ends."""
    survivor = 1 - lost
    nodes = {name: tmp_path / name / "peer-state" for name in ("a", "b", "new")}
    placed = {survivor: "a", lost: "b"}
    output_dir = tmp_path / "out"
    shards = launch(
        2,
        _train_env(
            artifacts, output_dir, SHARDYARD_MAX_STEPS="1000000", SHARDYARD_ATTEMPT="1", **_peer_run(sync_interval)
        ),
        rank_env={rank: {PEER_STATE_DIR_ENV: str(nodes[node])} for rank, node in placed.items()},
    )
    until(lambda: len(shards[survivor].sync_lines()) >= 3, 60, "three syncs")
    shards[lost].proc.kill()  # SIGKILL: the lost rank keeps nothing

    assert _wait(shards[lost], 10) == -signal.SIGKILL
    assert _wait(shards[survivor], 60) == exitcodes.COMM_ERROR, shards[survivor].stderr()
    kept = _kept_state(nodes["a"] / f"rank-{survivor}" / "state.json", shards[survivor], sync_interval)
    assert f"kept the gang's state of step {kept['step']}" in shards[survivor].stderr()
    assert not nodes["b"].exists() and not (output_dir / "checkpoint").exists()
    # Its last progress line is its last step, told when its sync failed (dated back to the step's end where it was
    # not told already): the goodput ledger ends the attempt's training there.
    last = shards[survivor].progress()[-1]
    if sync_interval > 1:  # it trained on alone to the next sync, which failed
        assert last["step"] == kept["step"] + sync_interval - 1 and last["ago_s"] > 0, (last, kept["step"])
    else:  # its next step's gradients could not be averaged
        assert last["step"] == kept["step"], (last, kept["step"])
    _resumes_as_if_nothing_failed(
        artifacts,
        launch,
        tmp_path,
        sync_interval=sync_interval,
        survivor=survivor,
        nodes=nodes,
        resume_step=kept["step"],
    )


@SYNC_CASES
def test_a_survivor_stuck_in_a_collective_keeps_the_state_when_its_agent_terminates_it(
    artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path, sync_interval: int, lost: int
) -> None:
    """The lost rank hangs with its connections open (a node powered off or cut off), so the survivor blocks in its
    next collective until its sync timeout (2 minutes here). SIGTERM, which its agent sends when it re-forms the
    gang, makes it keep the gang's state at once, stuck as it is, and end a second later, well within the agent's
    5 s grace before SIGKILL; the re-formed gang resumes from that state as if nothing had failed."""
    survivor = 1 - lost
    nodes = {name: tmp_path / name / "peer-state" for name in ("a", "b", "new")}
    placed = {survivor: "a", lost: "b"}
    run = {**_peer_run(sync_interval), "SHARDYARD_SYNC_TIMEOUT_S": "120"}
    shards = launch(
        2,
        _train_env(artifacts, tmp_path / "out", SHARDYARD_MAX_STEPS="1000000", SHARDYARD_ATTEMPT="1", **run),
        rank_env={rank: {PEER_STATE_DIR_ENV: str(nodes[node])} for rank, node in placed.items()},
    )
    until(lambda: len(shards[survivor].sync_lines()) >= 3, 60, "three syncs")
    shards[lost].proc.send_signal(signal.SIGSTOP)
    try:
        until(_idle_for(shards[survivor].proc.pid, 1.0), 30, "the survivor to block in a collective")
        shards[survivor].proc.send_signal(signal.SIGTERM)
        terminated = time.monotonic()
        kept_file = nodes["a"] / f"rank-{survivor}" / "state.json"
        until(kept_file.exists, 5, "the survivor to keep the gang's state within the agent's grace")
        kept_after = time.monotonic() - terminated
        assert shards[survivor].proc.poll() is None  # still stuck: another thread wrote the state
        assert _wait(shards[survivor], 4) == TERMINATED_EXIT, shards[survivor].stderr()
        ended_after = time.monotonic() - terminated
    finally:
        for shard in shards:
            shard.proc.kill()
            shard.proc.send_signal(signal.SIGCONT)
    kept = _kept_state(kept_file, shards[survivor], sync_interval)
    assert "still in a collective 1 s after SIGTERM; ending now" in shards[survivor].stderr()
    print(
        f"\nstuck survivor kept the state of step {kept['step']} {kept_after:.2f} s after SIGTERM,"
        f" ended {ended_after:.2f} s after it"
    )
    _resumes_as_if_nothing_failed(
        artifacts,
        launch,
        tmp_path,
        sync_interval=sync_interval,
        survivor=survivor,
        nodes=nodes,
        resume_step=kept["step"],
    )


def test_a_hung_peer_times_the_sync_out(artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path) -> None:
    rank0, rank1 = launch(2, _sync_env(artifacts, tmp_path / "out", SHARDYARD_SYNC_TIMEOUT_S="2"))
    until(lambda: len(rank1.sync_lines()) >= 2, 60, "two syncs")
    rank1.proc.send_signal(signal.SIGSTOP)  # alive but silent: only the timeout can tell
    stopped_at = time.monotonic()
    try:
        assert _wait(rank0, 30) == exitcodes.SYNC_TIMEOUT, rank0.stderr()
    finally:
        rank1.proc.kill()
    waited = time.monotonic() - stopped_at
    assert classify_exit(exitcodes.SYNC_TIMEOUT) is ExitCause.SYNC_TIMEOUT
    assert "sync timeout" in rank0.stderr()
    assert 2.0 <= waited < 15.0
    print(f"\nrank 0 exited SYNC_TIMEOUT {waited:.2f} s after its peer hung (timeout 2 s)")


def test_slow_syncs_widen_the_interval_alike_on_every_rank(
    artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path
) -> None:
    env = _train_env(
        artifacts,
        tmp_path / "out",
        SHARDYARD_MAX_STEPS="400",
        SHARDYARD_SYNC_INTERVAL="10",
        SHARDYARD_SLOW_SYNC_FACTOR="3",
        SHARDYARD_CHECKPOINT_EVERY="0",
    )
    rank0, rank1 = launch(2, env)
    until(lambda: len(rank1.sync_lines()) >= 6, 60, "six syncs at full speed")
    done = threading.Event()

    def throttle() -> None:
        # Rank 1 runs at a sixth of its speed from now on, so rank 0 waits for it at every sync for about five times
        # the 10 steps' own time: past the slow-sync factor of 3 with room to spare (at a quarter the wait was three
        # times, the factor itself, and on a loaded host the interval once stayed at 10), and well past the 50 ms
        # floor of a slow sync even when a step takes 5 ms.
        while not done.is_set() and rank1.proc.poll() is None:
            rank1.proc.send_signal(signal.SIGSTOP)
            time.sleep(0.05)
            rank1.proc.send_signal(signal.SIGCONT)
            time.sleep(0.01)

    thread = threading.Thread(target=throttle, daemon=True)
    thread.start()
    try:
        rcs = [_wait(shard, RUN_DEADLINE_S) for shard in (rank0, rank1)]
    finally:
        done.set()
        thread.join()
        if rank1.proc.poll() is None:
            rank1.proc.send_signal(signal.SIGCONT)

    assert rcs == [exitcodes.OK, exitcodes.OK], "\n".join(s.stderr() for s in (rank0, rank1))
    paces = [[(s["step"], s["sync_interval"], s["slow_syncs"]) for s in shard.sync_lines()] for shard in (rank0, rank1)]
    assert paces[0] == paces[1]  # the same syncs, at the same steps, widened at the same sync
    intervals = [interval for _, interval, _ in paces[0]]
    assert intervals == sorted(intervals) and intervals[0] == 10 and 20 <= intervals[-1] <= 80
    assert all(interval in (10, 20, 40, 80) for interval in intervals)
    assert "sync interval 10 -> 20" in rank0.stderr() and "sync interval 10 -> 20" in rank1.stderr()
    widened = next(step for step, interval, _ in paces[0] if interval == 20)
    print(f"\nslow syncs widened the interval 10 -> 20 at step {widened}; paces {sorted(set(intervals))}")
