"""Real job views (what ``/api/jobs/ID`` answers), folded by the monitor's own code from a job's events: waiting with
a long reason, then running, then succeeded. For what draws them (the progress bar)."""

from __future__ import annotations

import json
from typing import Any

from shardyard.events import (
    JobAccepted,
    JobReady,
    JobRunning,
    JobSucceeded,
    JobUnschedulable,
    PendingReason,
)
from shardyard.monitor.views import ClusterView
from tests.unit.builders import at, completed, job_spec, progress, scheduled, started

JOB = "progress-job"
LONG_REASON = (
    "/data/datasets/wikitext-103-raw-v1-tokenized absent on every node it could use (node-0, node-1): put it at"
    " /var/lib/shardyard/run/data/datasets/wikitext-103-raw-v1-tokenized"
)
FINAL_LOSS = 2.0123


def frames(job_id: str = JOB, max_steps: int = 30) -> list[dict[str, Any]]:
    """Each view of the job after one more of its events, as ``submit --wait`` is shown them (JSON values)."""
    spec = job_spec(job_id=job_id, max_steps=max_steps)
    events: list[object] = [
        JobAccepted(occurred_at=at(0), job_id=job_id, spec=spec, source_offset="s/0/0"),
        JobReady(occurred_at=at(0), job_id=job_id, spec=spec),
        JobUnschedulable(
            occurred_at=at(1), job_id=job_id, reason=PendingReason.WAITING_FOR_ARTIFACT, message=LONG_REASON
        ),
        scheduled(job_id, "node-0", "node-1", occurred_at=at(2)),
        started(job_id, 0, node_id="node-0", occurred_at=at(3)),
        started(job_id, 1, node_id="node-1", occurred_at=at(3)),
        JobRunning(occurred_at=at(3), job_id=job_id, attempt=1),
    ]
    for sync in range(1, 4):
        step = sync * max_steps // 3
        for shard in (0, 1):
            loss = 4.0 - sync * 0.5 - shard * 0.01
            events.append(
                progress(job_id, shard, node_id=f"node-{shard}", step=step, loss=loss, syncs=sync, occurred_at=at(3))
            )
    events += [
        completed(job_id, 0, node_id="node-0", final_loss=FINAL_LOSS, steps=max_steps, occurred_at=at(4)),
        completed(job_id, 1, node_id="node-1", final_loss=FINAL_LOSS + 0.01, steps=max_steps, occurred_at=at(4)),
        JobSucceeded(
            occurred_at=at(5), job_id=job_id, attempt=1, final_loss=FINAL_LOSS, checkpoint_dir="/data/checkpoints/x"
        ),
    ]
    view = ClusterView()
    shown: list[dict[str, Any]] = []
    for event in events:
        view.apply(event)
        shown.append(json.loads(json.dumps(view.jobs[job_id].detail())))  # as the API sends it: a copy, in JSON
    return shown
