"""The training parameters travel as one value, from the submission to the shard's runner, and every hop holds the
same fields: a parameter added to ``TrainingParams`` reaches the runner or a test here fails."""

from pathlib import Path
from typing import get_type_hints

from shardyard.admission import Admitted, admit
from shardyard.events import JobSpec, Workload
from shardyard.events.job import TRAINING_FIELDS, TrainingParams
from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.node_agent.environment import ShardPaths, shard_env
from shardyard.scheduler.admission import workload
from shardyard.training.config import TRAINING_ENV, RunConfig, training_env
from tests.unit.builders import T0, assignment, raw, submission

ASKED = {"max_steps": 40, "batch_size": 4, "seq_len": 32, "lr": 0.012345678901234, "seed": 7}


def test_the_spec_and_the_workload_hold_every_parameter_with_its_type() -> None:
    wanted = {name: get_type_hints(TrainingParams)[name] for name in TRAINING_FIELDS}
    for holder in (JobSpec, Workload):
        hints = get_type_hints(holder)
        assert {name: hints.get(name) for name in TRAINING_FIELDS} == wanted, holder.__name__
    assert set(TRAINING_ENV) == set(TRAINING_FIELDS)


def test_what_the_job_asked_reaches_the_runner_unchanged() -> None:
    admitted = admit(raw(submission(training=ASKED)), catalogue=DEFAULT_TFLOPS, submitted_at=T0, fallback_id="x-0-0")
    assert isinstance(admitted, Admitted)
    spec = admitted.spec
    assert spec.training == TrainingParams(**ASKED)

    work = workload(spec, output_path="/data/checkpoints/x", resume_from=None)
    assert work.training == spec.training

    paths = ShardPaths(model=Path("/m"), dataset=Path("/d"), output=Path("/o"))
    env = shard_env(assignment(workload=work), paths, base_env={})
    assert {variable: env[variable] for variable in TRAINING_ENV.values()} == training_env(work.training)
    config = RunConfig.from_env(env)
    assert {name: getattr(config, name) for name in TRAINING_FIELDS} == ASKED  # the float exactly
