"""A job's secrets never leave the agent in a shard's failure text: every env value of 4 characters or more, and any
value of a secret-looking name, becomes ``***``; overlapping secrets are masked together."""

import pytest

from shardyard import secret_env
from shardyard.events import ShardFailed
from shardyard.events.job import Entrypoint
from shardyard.node_agent.book import AgentBook
from shardyard.node_agent.redaction import MASK, redact, secrets_of
from tests.unit.builders import assignment, at, workload


def scrub(text: str, env: dict[str, str]) -> str:
    return redact(text, secrets_of(env))


@pytest.mark.parametrize(
    ("env", "text", "expected"),
    [
        pytest.param({"MODE": "abc"}, "mode abc", "mode abc", id="3-chars-kept"),
        pytest.param({"MODE": "abcd"}, "mode abcd!", f"mode {MASK}!", id="4-chars-masked"),
        pytest.param({"API_KEY": "ab"}, "key=ab;", f"key={MASK};", id="secret-name-any-length"),
        pytest.param({"my_token": "x1"}, "t x1", f"t {MASK}", id="secret-name-case-insensitive"),
        pytest.param({"DB_PASSWORD": "", "X": ""}, "exit code 1", "exit code 1", id="empty-values-ignored"),
        pytest.param({"HF_TOKEN": "hf_secret_value_123"}, "a hf_secret_value_123 b", f"a {MASK} b", id="token"),
        pytest.param(
            {"A": "hf_secret", "B": "hf_secret_value_123"},
            "x hf_secret_value_123 y hf_secret z",
            f"x {MASK} y {MASK} z",
            id="longest-first-contained",
        ),
        pytest.param({"A": "abcXYZ", "B": "XYZdef"}, "-abcXYZdef-", f"-{MASK}-", id="overlap-masked-together"),
        pytest.param({"A": "aaaa"}, "aaaaaa", MASK, id="self-overlapping"),
        pytest.param({"A": "pass1234"}, "pass1234 and pass1234", f"{MASK} and {MASK}", id="every-occurrence"),
        pytest.param(
            {"KEY_PEM": "-----BEGIN-----\n  abcdefgh  \n-----END-----"},
            "line abcdefgh | -----END-----",
            f"line {MASK} | {MASK}",
            id="multi-line-value-line-by-line",
        ),
        pytest.param({"CREDENTIALS": "c", "SECRET_X": "hunter2"}, "c hunter2", f"{MASK} {MASK}", id="both-rules"),
    ],
)
def test_redact(env: dict[str, str], text: str, expected: str) -> None:
    assert scrub(text, env) == expected


def test_secrets_come_longest_first() -> None:
    assert secrets_of({"A": "abcd", "B": "abcdefgh", "C": "ab"}) == ("abcdefgh", "abcd")


def test_a_failed_entrypoint_shard_reports_its_log_tail_without_the_jobs_secrets() -> None:
    env = {"HF_TOKEN": "hf_secret_value_123", "MODE": "abc"}
    job = assignment(workload=workload(entrypoint=Entrypoint(command=["python", "train.py"], env=env)))
    book = AgentBook(job.node_id)
    book.on_assignment(job)

    event = book.finished(
        (job.job_id, job.shard_index, job.attempt),
        1,
        now=at(),
        final=None,
        message="exit code 1: token is hf_secret_value_123 | mode abc",
    )

    assert isinstance(event, ShardFailed)
    assert event.message == "exit code 1: token is *** | mode abc"


def test_a_value_that_travelled_encrypted_is_redacted_as_the_shard_saw_it() -> None:
    key = secret_env.agents_key(b"c" * 32)
    job = assignment(workload=workload(entrypoint=Entrypoint(command=["python", "train.py"])))
    sealed = secret_env.encrypt(key, job.job_id, "HF_TOKEN", "hf_secret_value_123", sealer=secret_env.AGENTS)
    job = assignment(workload=workload(entrypoint=Entrypoint(command=["python", "train.py"], env={"HF_TOKEN": sealed})))
    book = AgentBook(job.node_id, env_key=key)
    book.on_assignment(job)

    event = book.finished(
        (job.job_id, job.shard_index, job.attempt), 1, now=at(), final=None, message="token is hf_secret_value_123"
    )

    assert isinstance(event, ShardFailed) and event.message == "token is ***"
