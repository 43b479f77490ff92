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

- ``total``: the life itself; ``queued``: submission until the first placement (the timeline's first
  ``scheduled``, where the test read it; else until the first attempt's processes appear, which an agent's start
  latency puts later: 1.4 s once in the chaos test) (no job here is preempted); ``notice``, ``degraded``,
  ``straggler``: 0 (no preemption, only full matches, no straggler);
- a job that ran once, untroubled: ``productive`` is the longest shard's training time and the end's lag behind its
  last process; ``recovery`` the rest of its attempt (its processes' start to the first step, and their exit after
  the last), ``recomputed`` 0;
- a job whose attempts a fault ended: the time no process of it was alive (between one attempt's last process and the
  next one's first) is neither ``productive`` nor ``recomputed``, and both together fit within its processes' lives.

The truth's own error is the sampling (0.1 s) and a process's start and exit around its training (well under a
second); the share is of lives of one to several minutes.

Where the shards logged every step with its time (the agents' ``step_log_every_s`` 0), the truth of every job, a
faulted one's too, is exact, and ``productive``, ``recovery`` and ``recomputed`` are judged by an equality instead
(``step_parts``, ``Truth.exact``): what each attempt trained, from its gang's first step to its last, is productive
the first time a step is taken and recomputed when taken again, and the rest of the job's time, placement, restarts
and waits, is recovery. A job whose attempts a fault ended is held to the bounds above as well. On a loaded host
the fault manager may find a straggler the test did not cause (a rank slower than the others for 20 s, and swap it):
the ledger then turns a share of the training time into ``straggler``, by the detector's measure of how much slower
the rank was, which no outside truth gives; ``productive`` and ``straggler`` together are judged then.
"""

import itertools
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

STEPPED = re.compile(r": step (?P<step>\d+)/\d+ loss \S+ syncs \d+ at (?P<at>\S+)Z$", re.MULTILINE)
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
    placed: float | None = None
    """Wall time of the job's first placement (its timeline's first ``scheduled``)."""
    steps: dict[int, dict[int, list[tuple[float, int]]]] = field(default_factory=dict)
    """Attempt -> its shards' step lines (``stepped``), where its shards logged every step."""

    @property
    def exact(self) -> dict[str, float] | None:
        """The parts the step lines give (``step_parts``); None without them."""
        if self.placed is None or not any(self.steps.values()):
            return None
        return step_parts(self.submitted, self.placed, self.ended, self.steps)

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


def stepped(log_dir: Path, attempt: int) -> dict[int, list[tuple[float, int]]]:
    """Every step line of an attempt's shard logs: shard -> (wall time the step ended, the step), in order."""
    found: dict[int, list[tuple[float, int]]] = {}
    for log in sorted(log_dir.glob(f"shard-*-attempt-{attempt}.log")):
        lines = [
            (datetime.fromisoformat(match["at"]).replace(tzinfo=UTC).timestamp(), int(match["step"]))
            for match in STEPPED.finditer(log.read_text(errors="replace"))
        ]
        if lines:
            found[int(log.name.split("-")[1])] = sorted(lines)
    return found


def step_parts(
    submitted: float, first_placed: float, ended: float, attempts: dict[int, dict[int, list[tuple[float, int]]]]
) -> dict[str, float]:
    """The true parts of a job whose every step its shards logged (``stepped``, per attempt), the faults its test's,
    the gang's steps being its shards' (a shard steps alone between two syncs of local SGD):

    - ``queued``: submission to the first placement (no job here is preempted);
    - per attempt, from its first step ``F`` (when every shard had taken one) to the moment it took again the
      highest step ``H`` any earlier attempt took (when every shard had): ``recomputed``; from then (or ``F``, where
      it resumed above ``H``) to its last step (any shard's): ``productive``; the last attempt's productive time
      runs on to the job's end (the final save and the report, which the ledger counts as the attempt's);
    - ``recovery``: the rest (placements, start-ups, the stall after a fault, the wait for re-placement)."""
    parts = dict.fromkeys(("queued", "productive", "recomputed", "notice", "degraded", "straggler"), 0.0)
    parts["queued"] = first_placed - submitted
    high = -1
    numbers = sorted(number for number, shards in attempts.items() if shards)
    for number in numbers:
        shards = attempts[number].values()
        first = max(lines[0][0] for lines in shards)
        last = max(lines[-1][0] for lines in shards)
        caught = max(min((at for at, step in lines if step >= high), default=last) for lines in shards)
        caught = min(max(caught, first), last) if min(lines[0][1] for lines in shards) <= high else first
        parts["recomputed"] += caught - first
        parts["productive"] += (ended if number == numbers[-1] else last) - caught
        high = max(high, *(lines[-1][1] for lines in shards))
    parts["recovery"] = (ended - submitted) - sum(parts.values())
    return parts


def misjudged_parts(
    ledger: dict[str, Any], truth: dict[str, float], life: float, share: float = 0.02
) -> dict[str, str]:
    """Part -> how the ledger is off ``truth`` (``step_parts``) by more than ``share`` of the ``life``."""
    bound = share * life
    return {
        part: f"{float(ledger[f'{part}_s']):.2f} s, truth {seconds:.2f} s (bound {bound:.2f} s of a {life:.1f} s life)"
        for part, seconds in truth.items()
        if abs(float(ledger[f"{part}_s"]) - seconds) > bound
    }


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
    placed = (
        truth.placed if truth.placed is not None else truth.spans[1][0]
    )  # where the test read it, else its upper end
    judge("queued", parts["queued"], placed - truth.submitted)
    exact = truth.exact
    slowed = exact is not None and parts["straggler"] > 0
    for part in ("notice", "degraded", *(() if slowed else ("straggler",))):
        judge(part, parts[part], 0.0)
    if exact is not None:
        for part in ("recovery", "recomputed"):
            judge(part, parts[part], exact[part])
        if slowed:  # see the module's doc: a straggler of a loaded host
            judge("productive+straggler", parts["productive"] + parts["straggler"], exact["productive"])
        else:
            judge("productive", parts["productive"], exact["productive"])
    elif len(truth.spans) == 1 and 1 in truth.trained_s:
        first, last = truth.spans[1]
        judge("productive", parts["productive"], truth.trained_s[1] + truth.end_lag_s)
        judge("recovery", parts["recovery"], (last - first) - truth.trained_s[1])
        judge("recomputed", parts["recomputed"], 0.0)
    if len(truth.spans) > 1:
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
    if (exact := truth.exact) is not None:
        seen = {part: float(ledger[f"{part}_s"]) for part in exact}
        seen["productive"] += float(ledger["straggler_s"])  # a straggler's share is training time (``misjudged``)
        out.update({part: abs(seen[part] - exact[part]) / life for part in ("productive", "recovery", "recomputed")})
    elif len(truth.spans) == 1 and 1 in truth.trained_s:
        out["productive"] = abs(float(ledger["productive_s"]) - truth.trained_s[1] - truth.end_lag_s) / life
    return out
