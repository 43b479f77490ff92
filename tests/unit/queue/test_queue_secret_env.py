"""Entrypoint environments on the bus (``shardyard.secret_env``): encrypted by the submitting team to the queue,
decrypted there and encrypted again to the agents; what the queue publishes carries no value in the clear, and a
value it cannot decrypt, or one another team encrypted, refuses the submission."""

import json

import pytest

from shardyard import secret_env
from shardyard.events import JobAccepted, JobRejected, RejectReason
from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.queue.book import QueueBook
from tests.unit.builders import raw, submission
from tests.unit.queue.test_queue_auth import A_NEW, B_KEY, CREDENTIALS, answer, signed

AGENTS_KEY = secret_env.agents_key(b"c" * 32)
ENTRY = {"command": ["python", "train.py"]}


def with_env(task_id: str, env: dict[str, str], queue: str = "team-a") -> bytes:
    return raw(submission(task_id=task_id, queue=queue, entrypoint={**ENTRY, "env": env}))


def by_team(task_id: str, value: str, *, secret: str = A_NEW, sealer: str = "team/team-a/k2") -> str:
    return secret_env.encrypt(secret_env.team_key(secret), task_id, "TOKEN", value, sealer=sealer)


BY_B = by_team("job-1", "x", secret=B_KEY, sealer="team/team-b/k1")


def book(env_key: bytes | None = AGENTS_KEY) -> QueueBook:
    return QueueBook(DEFAULT_TFLOPS, credentials=CREDENTIALS, env_key=env_key)


def test_the_teams_value_is_encrypted_again_to_the_agents_and_opens_there() -> None:
    data = with_env("job-1", {"TOKEN": by_team("job-1", "s3cret"), "PLAIN": "visible"})

    accepted = answer(book(), data, signed(data), 0)

    assert isinstance(accepted, JobAccepted) and accepted.spec.entrypoint is not None
    env = accepted.spec.entrypoint.env
    assert "s3cret" not in json.dumps(accepted.model_dump(mode="json")) and "visible" not in str(env)
    assert {secret_env.sealer_of(v) for v in env.values()} == {secret_env.AGENTS}
    assert secret_env.decrypt_all(env, AGENTS_KEY, "job-1") == {"TOKEN": "s3cret", "PLAIN": "visible"}
    with pytest.raises(secret_env.SecretEnvError):
        secret_env.decrypt_all(env, secret_env.agents_key(b"d" * 32), "job-1")  # another cluster's agents
    with pytest.raises(secret_env.SecretEnvError):
        secret_env.decrypt_all(env, AGENTS_KEY, "job-2")  # moved to another job


def test_without_a_cluster_secret_the_values_go_on_as_they_came_decrypted() -> None:
    data = with_env("job-1", {"TOKEN": by_team("job-1", "s3cret")})

    accepted = answer(book(env_key=None), data, signed(data), 0)

    assert isinstance(accepted, JobAccepted) and accepted.spec.entrypoint is not None
    assert accepted.spec.entrypoint.env == {"TOKEN": "s3cret"}


@pytest.mark.parametrize(
    ("value", "signer", "reason"),
    [
        pytest.param(BY_B, "team-a", RejectReason.UNAUTHENTICATED, id="encrypted-by-another-team"),
        pytest.param(by_team("job-9", "x"), "team-a", RejectReason.INVALID_VALUE, id="made-for-another-job"),
        pytest.param(by_team("job-1", "x", secret=B_KEY), "team-a", RejectReason.INVALID_VALUE, id="wrong-key"),
        pytest.param(by_team("job-1", "x")[:-6] + "AAAAAA", "team-a", RejectReason.INVALID_VALUE, id="altered"),
        pytest.param(by_team("job-1", "x", sealer="team/team-a/k9"), "team-a", RejectReason.UNAUTHENTICATED,
                     id="unknown-key"),
        pytest.param(by_team("job-1", "x"), None, RejectReason.UNAUTHENTICATED, id="unsigned"),
    ],
)  # fmt: skip
def test_a_value_the_queue_cannot_open_refuses_the_submission(
    value: str, signer: str | None, reason: RejectReason
) -> None:
    queue = "team-a" if signer else "public"
    data = with_env("job-1", {"TOKEN": value}, queue=queue)

    refused = answer(book(), data, signed(data) if signer else None, 0)

    assert isinstance(refused, JobRejected) and refused.reason is reason, refused
    assert "TOKEN" in refused.message


def test_an_agent_refuses_a_value_not_encrypted_to_it() -> None:
    team_value = by_team("job-1", "s3cret")
    with pytest.raises(secret_env.SecretEnvError, match="not to this node's agents"):
        secret_env.decrypt_all({"TOKEN": team_value}, AGENTS_KEY, "job-1")
    agents_value = secret_env.encrypt(AGENTS_KEY, "job-1", "TOKEN", "s3cret", sealer=secret_env.AGENTS)
    with pytest.raises(secret_env.SecretEnvError):
        secret_env.decrypt_all({"TOKEN": agents_value}, None, "job-1")  # this node has no cluster secret
    assert secret_env.decrypt_all({"PLAIN": "v"}, None, "job-1") == {"PLAIN": "v"}
