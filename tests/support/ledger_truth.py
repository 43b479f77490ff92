"""A job's goodput ledger (``shardyard.goodput``, the ``goodput`` of the status API) held against what a test knows
from outside the cluster, where it caused the faults itself:

- when it submitted the job (its own clock);
- when each attempt's shard processes were first and last seen alive (the process table, sampled every 0.1 s);
- how long each shard trained, from its first step to its last, by the shard's own clock (its log's closing
  ``trained steps A..B, N steps in S s after the first`` line, which a shard killed mid-training never writes).

The job's end is when the scheduler ended it (its timeline's ``succeeded``, what its user waits for): the ledger
counts the moments between its last shard's exit and that end (the scheduler hearing of it) as the last attempt's,
productive, and so does the truth here.

Each part is judged within ``share`` (2 %) of the job's life, submission to its end:

- ``total``: the life itself; ``queued``: submission until the first attempt's processes appear (no job here is
  preempted); ``notice``, ``degraded``, ``straggler``: 0 (no preemption, only full matches, no straggler);
- a job that ran once, untroubled: ``productive`` is the longest shard's training time and the end's lag behind its
  last process; ``recovery`` the rest of its attempt (its processes' start to the first step, and their exit after
  the last), ``recomputed`` 0;
- a job whose attempts a fault ended: the time no process of it was alive (between one attempt's last process and the
  next one's first) is neither ``productive`` nor ``recomputed``, and both together fit within its processes' lives.

The truth's own error is the sampling (0.1 s) and a process's start and exit around its training (well under a
second); the share is of lives of one to several minutes.
"""

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRAINED = re.compile(r"trained steps \d+\.\.\d+, \d+ steps in (?P<seconds>[\d.]+) s after the first")
PARTS = ("queued", "productive", "recovery", "recomputed", "notice", "degraded", "straggler")


@dataclass
class Truth:
    submitted: float
    """Wall time the test submitted the job."""
    ended: float
    """Wall time the job ended, as its timeline says (the scheduler's ``succeeded``)."""
    spans: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Attempt -> wall times its first shard process was first seen alive and its last one last seen."""
    trained_s: dict[int, float] = field(default_factory=dict)
    """Attempt -> the longest training, first step to last, any of its shards reported in its log (where one did)."""

    @property
    def life_s(self) -> float:
        return self.ended - self.submitted

    @property
    def end_lag_s(self) -> float:
        """From the last process of the job to its end."""
        return max(0.0, self.ended - max(last for _first, last in self.spans.values()))

    @property
    def dead_s(self) -> float:
        """Time between attempts with no process of the job alive."""
        ordered = [self.spans[attempt] for attempt in sorted(self.spans)]
        return sum(max(0.0, later[0] - earlier[1]) for earlier, later in itertools.pairwise(ordered))

    @property
    def alive_s(self) -> float:
        return sum(last - first for first, last in self.spans.values())


def trained_s(log_dir: Path, attempt: int) -> float | None:
    """The longest first-to-last-step training among an attempt's shard logs, or None where none wrote it."""
    found = [
        float(match["seconds"])
        for log in sorted(log_dir.glob(f"shard-*-attempt-{attempt}.log"))
        if (match := TRAINED.search(log.read_text(errors="replace")))
    ]
    return max(found) if found else None


def misjudged(ledger: dict[str, Any], truth: Truth, *, share: float = 0.02) -> dict[str, str]:
    """Part -> how the ledger is off the truth by more than ``share`` of the life; empty when it holds."""
    life = truth.life_s
    bound = share * life
    parts = {part: float(ledger[f"{part}_s"]) for part in PARTS}
    off: dict[str, str] = {}

    def judge(part: str, seen: float, truth_s: float, *, at_least: bool = False) -> None:
        wrong = seen < truth_s - bound if at_least else abs(seen - truth_s) > bound
        if wrong:
            relation = ">=" if at_least else "~"
            off[part] = f"{seen:.2f} s, truth {relation} {truth_s:.2f} s (bound {bound:.2f} s of a {life:.1f} s life)"

    if abs(sum(parts.values()) - float(ledger["total_s"])) > 0.01:
        off["sum"] = f"the parts add up to {sum(parts.values()):.3f} s, the total is {ledger['total_s']}"
    judge("total", float(ledger["total_s"]), life)
    judge("queued", parts["queued"], truth.spans[1][0] - truth.submitted)
    for part in ("notice", "degraded", "straggler"):
        judge(part, parts[part], 0.0)
    if len(truth.spans) == 1 and 1 in truth.trained_s:
        first, last = truth.spans[1]
        judge("productive", parts["productive"], truth.trained_s[1] + truth.end_lag_s)
        judge("recovery", parts["recovery"], (last - first) - truth.trained_s[1])
        judge("recomputed", parts["recomputed"], 0.0)
    elif len(truth.spans) > 1:
        judge("recovery+queued", parts["recovery"] + parts["queued"], truth.dead_s, at_least=True)
        training = parts["productive"] + parts["recomputed"]
        if training > truth.alive_s + bound:
            off["productive+recomputed"] = (
                f"{training:.2f} s counted training, its processes lived {truth.alive_s:.2f} s"
            )
    return off


def deviations(ledger: dict[str, Any], truth: Truth) -> dict[str, float]:
    """For the report: each part judged by an equality, its distance from the truth as a share of the life."""
    life = truth.life_s
    out = {
        "total": abs(float(ledger["total_s"]) - life) / life,
        "queued": abs(float(ledger["queued_s"]) - (truth.spans[1][0] - truth.submitted)) / life,
    }
    if len(truth.spans) == 1 and 1 in truth.trained_s:
        out["productive"] = abs(float(ledger["productive_s"]) - truth.trained_s[1] - truth.end_lag_s) / life
    return out
