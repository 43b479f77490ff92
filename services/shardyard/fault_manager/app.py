"""Wiring of the fault-manager service."""

from typing import Self

from faststream import FastStream
from pydantic import Field, model_validator

from shardyard.bus.topics import ASSIGNMENTS, FAILURES, LIFECYCLE, LINKS, NODE_STATE, REDUNDANCY, SHARD_EVENTS
from shardyard.clock import Clock
from shardyard.fault_manager.book import FaultBook
from shardyard.fault_manager.handlers import FaultHandlers
from shardyard.fault_manager.recovery import RetryPolicy
from shardyard.fault_manager.redundancy import RedundancyPolicy, RedundancyTracker
from shardyard.service import Follow, Periodic, Split, partitioned_app, replica_bus
from shardyard.settings import ReplicatedSettings

SERVICE = "fault-manager"
GROUP = "shardyard-fault-manager"


UNREAD = frozenset(
    {
        "job.accepted",
        "job.rejected",
        "job.ready",
        "job.unschedulable",
        "job.waiting",
        "job.running",
        "shard.checkpointed",
        "shard.stop_request",
        "shard.revocation",
    }
)
"""Followed facts the fault manager never applies (its book, the redundancy window): passed over undecoded."""


class FaultSettings(ReplicatedSettings):
    """The fault manager: shard failures and node losses become recovery plans (or the job's end); the recent
    failure rate sets the spare ratio."""

    max_retries: int = Field(default=3, ge=0, description="recoveries per job before it ends FAILED")
    retry_backoff_s: float = Field(
        default=2.0, ge=0, description="wait before the 2nd retry (the 1st is immediate), doubling after"
    )
    retry_backoff_max_s: float = Field(default=30.0, ge=0, description="longest wait before a retry")
    comm_grace_s: float = Field(
        default=3.5, ge=0, description="how long COMM_ERRORs alone wait for their culprit (a node turning SUSPECT)"
    )
    silent_grace_s: float = Field(
        default=10.0,
        ge=0,
        description="the same wait while a training shard of the gang has reported nothing (its node may be down)",
    )
    disk_floor_bytes: int = Field(
        default=RetryPolicy.disk_floor_bytes, ge=0, description="a node has room for a job off a full disk above this"
    )
    disk_full_moves: int = Field(
        default=RetryPolicy.disk_full_moves, ge=0, description="moves off a full disk a job gets outside its budget"
    )
    tick_interval_s: float = Field(default=0.25, gt=0, description="how often due decisions and the ratio are checked")
    redundancy_window_s: float = Field(default=600.0, gt=0, description="window of the shard failure rate")
    redundancy_min_ratio: float = Field(default=0.0, ge=0, le=1, description="lowest spare ratio")
    redundancy_max_ratio: float = Field(default=0.5, ge=0, le=1, description="highest spare ratio")
    redundancy_step: float = Field(default=0.05, gt=0, le=1, description="the spare ratio moves in these steps")

    @model_validator(mode="after")
    def _ratio_bounds(self) -> Self:
        if self.redundancy_min_ratio > self.redundancy_max_ratio:
            raise ValueError("redundancy_min_ratio must not exceed redundancy_max_ratio")
        return self

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_retries=self.max_retries,
            backoff_s=self.retry_backoff_s,
            backoff_max_s=self.retry_backoff_max_s,
            comm_grace_s=self.comm_grace_s,
            silent_grace_s=self.silent_grace_s,
            disk_floor_bytes=self.disk_floor_bytes,
            disk_full_moves=self.disk_full_moves,
        )

    def redundancy_policy(self) -> RedundancyPolicy:
        return RedundancyPolicy(
            window_s=self.redundancy_window_s,
            min_ratio=self.redundancy_min_ratio,
            max_ratio=self.redundancy_max_ratio,
            step=self.redundancy_step,
        )


def build_app(settings: FaultSettings, *, clock: Clock) -> FastStream:
    """Every replica follows every fact; the consumer group on the shard-events topic (keyed by job) splits the jobs
    between the replicas, and a replica decides for the jobs of its partitions only. When one dies, the group gives
    its partitions to the others within one election's time."""
    bus = replica_bus(SERVICE, settings)
    book = FaultBook(policy=settings.retry_policy(), owned=frozenset())  # until the group gives it partitions
    redundancy = RedundancyTracker(policy=settings.redundancy_policy())
    handlers = FaultHandlers(book, redundancy, bus, clock)
    follow = Follow(
        [LIFECYCLE, ASSIGNMENTS, SHARD_EVENTS, NODE_STATE, FAILURES, REDUNDANCY, LINKS],  # links: stragglers
        handlers.on_followed,
        unread=UNREAD,
    )
    # The group's members own the shard-events partitions; the member that reads a bad shard event or node loss
    # dead-letters it (the follower only skips it).
    split = Split(
        SHARD_EVENTS,
        GROUP,
        handlers.own,
        lambda: book.owned,
        who=f"fault manager {settings.instance} decides the jobs",
        routes={SHARD_EVENTS: handlers.on_owned, FAILURES: handlers.on_owned},
    )

    def live() -> None:
        handlers.live = True

    return partitioned_app(
        bus,
        settings,
        clock,
        follow=follow,
        split=split,
        # Its first tick decides what the log left undecided (for the jobs this replica owns).
        ticker=Periodic("fault-decisions", settings.tick_interval_s, handlers.tick),
        on_caught_up=live,
    )
