"""Failure handling: a failed shard or a lost node ends its job FAILED with the cause (retries come later).

Pure: facts in (assignments, shard events, node losses, lifecycle), decisions out as events.
"""

from dataclasses import dataclass, field
from datetime import datetime

from shardyard.events import (
    Event,
    FailureCause,
    JobFailed,
    JobScheduled,
    JobSucceeded,
    NodeLost,
    ShardAssignment,
    ShardCause,
    ShardFailed,
)


@dataclass
class FaultBook:
    # job -> (attempt, {shard_index: node_id}) of its current gang
    gangs: dict[str, tuple[int, dict[int, str]]] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)

    def apply(self, event: object) -> None:
        match event:
            case JobScheduled() if event.job_id not in self.ended:
                self.gangs[event.job_id] = (event.attempt, {p.shard_index: p.node_id for p in event.placements})
            case ShardAssignment() if event.job_id not in self.ended:
                attempt, shards = self.gangs.get(event.job_id, (event.attempt, {}))
                if event.attempt >= attempt:
                    shards = shards if event.attempt == attempt else {}
                    shards[event.shard_index] = event.node_id
                    self.gangs[event.job_id] = (event.attempt, shards)
            case JobSucceeded() | JobFailed():
                self.ended.add(event.job_id)
                self.gangs.pop(event.job_id, None)
            case _:
                pass

    def on_shard_failed(self, event: ShardFailed, now: datetime) -> list[Event]:
        current = self.gangs.get(event.job_id)
        if event.job_id in self.ended or (current is not None and current[0] > event.attempt):
            return []  # a job already ended (or a redelivery), or a failure of an attempt already replaced
        failed = JobFailed(
            occurred_at=now,
            job_id=event.job_id,
            attempt=event.attempt,
            cause=event.cause,
            message=f"shard {event.shard_index} on {event.node_id} failed: {event.message}",
            causes=(
                ShardCause(
                    shard_index=event.shard_index, node_id=event.node_id, cause=event.cause, message=event.message
                ),
            ),
        )
        self.apply(failed)
        return [failed]

    def on_node_lost(self, event: NodeLost, now: datetime) -> list[Event]:
        out: list[Event] = []
        for job_id, (attempt, shards) in list(self.gangs.items()):
            lost = sorted(index for index, node in shards.items() if node == event.node_id)
            if not lost:
                continue
            message = f"node {event.node_id} silent for {event.silent_for_s:.1f}s"
            failed = JobFailed(
                occurred_at=now,
                job_id=job_id,
                attempt=attempt,
                cause=FailureCause.NODE_LOST,
                message=f"shards {lost} lost: {message}",
                causes=tuple(
                    ShardCause(shard_index=i, node_id=event.node_id, cause=FailureCause.NODE_LOST, message=message)
                    for i in lost
                ),
            )
            self.apply(failed)
            out.append(failed)
        return out
