"""Wiring of the queue service: the only place that connects its book to the bus."""

from collections.abc import Awaitable, Callable
from pathlib import Path

from faststream import FastStream
from pydantic import Field

from shardyard.admission import DEFAULT_PATH_PREFIXES, Policy
from shardyard.bus.topics import LIFECYCLE, QUEUES, SUBMISSIONS
from shardyard.clock import Clock
from shardyard.errors import ConfigError
from shardyard.gpus import catalogue_with
from shardyard.queue.book import QueueBook
from shardyard.queue.credentials_watch import CredentialsWatch
from shardyard.queue.handlers import QueueHandlers
from shardyard.queues_file import POLL_S, QueuesWatch
from shardyard.secret_env import agents_key_from_env
from shardyard.service import Follow, Periodic, Split, partitioned_app, replica_bus
from shardyard.settings import GpuFigures, ReplicatedSettings
from shardyard.signing import Credentials, CredentialsError, read_credentials

SERVICE = "queue"
GROUP = "shardyard-queue"


class QueueSettings(ReplicatedSettings):
    """The queue: admission and ordering of submitted jobs."""

    gpu_tflops: GpuFigures = Field(default_factory=list, description="catalogue overrides, MODEL=TFLOPS")
    job_path_prefixes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PATH_PREFIXES),
        description="job paths (dependencies, working_dir) must lie under one of these: the agents' mount prefixes",
    )
    allow_env: list[str] = Field(
        default_factory=list,
        description="environment names jobs may set although they change how code is loaded (LD_*, PATH, ...)",
    )
    credentials_file: str | None = Field(
        default=None,
        description="the teams' keys (YAML, see shardyard.signing): submissions must be signed by their queue's team, "
        "or be unsigned into its anonymous_queue; without it every submission is taken",
    )
    queues_file: str | None = Field(
        default=None,
        description="the teams' queues (YAML, see examples/queues.yaml): read again on change and published on the "
        "queues topic; without it the queues in force are the topic's (none: any queue name, no quotas)",
    )

    def policy(self) -> Policy:
        return Policy(path_prefixes=tuple(self.job_path_prefixes), allowed_env=frozenset(self.allow_env))


def _credentials(path: str | None) -> Credentials | None:
    if path is None:
        return None
    try:
        return read_credentials(Path(path))
    except CredentialsError as error:
        raise ConfigError(str(error)) from None


def build_app(settings: QueueSettings, *, clock: Clock) -> FastStream:
    """Every replica follows the lifecycle topic (the whole job table); the consumer group on the submissions topic
    (keyed by job) splits the jobs between the replicas, and a replica admits and settles the jobs of its partitions
    only. When one dies, the group gives its partitions to the others within one election's time."""
    bus = replica_bus(SERVICE, settings)
    # No partitions until the group gives it some.
    credentials = _credentials(settings.credentials_file)
    book = QueueBook(
        catalogue_with(settings.gpu_tflops),
        owned=frozenset(),
        policy=settings.policy(),
        credentials=credentials,
        env_key=agents_key_from_env(),  # entrypoint environments travel on encrypted to the agents
    )
    handlers = QueueHandlers(book, bus, clock)
    split = Split(
        SUBMISSIONS,
        GROUP,
        handlers.own,
        lambda: book.owned,
        who=f"queue {settings.instance} decides the jobs",
        raw_routes={SUBMISSIONS: handlers.on_submissions},
        job_path=True,
    )
    ticks: list[Callable[[], Awaitable[None]]] = []
    if settings.queues_file is not None:
        who = f"{SERVICE}-{settings.instance}"
        ticks.append(QueuesWatch(settings.queues_file, bus, clock, in_force=handlers.queues_in_force, who=who).tick)
    if settings.credentials_file is not None:
        ticks.append(CredentialsWatch(Path(settings.credentials_file), book.gate).tick)

    async def watch_files() -> None:
        for tick in ticks:
            await tick()

    # Started once the log was read (the queues version in force is the topic's).
    ticker = Periodic("team-files", POLL_S, watch_files) if ticks else None
    follow = Follow([LIFECYCLE, QUEUES], handlers.on_followed)
    return partitioned_app(bus, settings, clock, follow=follow, split=split, ticker=ticker)
