"""A job's own script that checkpoints on a preemption notice, with nothing but the runtime's contract: no torch, no
``shardyard`` import (docs/users/own-script.md, "Checkpoint on notice").

Each step is a fixed piece of CPU work. The script keeps no periodic checkpoint: only on the notice (the signal
named by ``SHARDYARD_NOTICE_SIGNAL``) does it write its step to ``SHARDYARD_CHECKPOINT_DIR``, after the step in
progress, and exit 75 (preempted). The next attempt finds that checkpoint in ``SHARDYARD_RESUME_DIR`` and goes on
from its step. Each notice and each resume is also appended, one JSON line each, to
``<SHARDYARD_OUTPUT_DIR>/notices.jsonl``, so that what a preemption lost can be read afterwards.

    python examples/checkpoint_on_notice.py --steps 400 --work 20000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

PREEMPTED = 75  # the exit status that acknowledges the notice
STATE = "state.json"


def load_step(resume_dir: str | None) -> int:
    """The step the checkpoint to resume from holds (0: none)."""
    if not resume_dir or not (Path(resume_dir) / STATE).is_file():
        return 0
    return int(json.loads((Path(resume_dir) / STATE).read_text())["step"])


def save_step(checkpoint_dir: Path, step: int) -> None:
    """The checkpoint, atomically: a new file renamed over the old one."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    partial = checkpoint_dir / f".{STATE}.partial"
    partial.write_text(json.dumps({"step": step}))
    os.replace(partial, checkpoint_dir / STATE)


def record(line: dict[str, object]) -> None:
    output = os.environ.get("SHARDYARD_OUTPUT_DIR")
    if output:
        Path(output).mkdir(parents=True, exist_ok=True)  # the runtime makes it for the checkpoint's sake, not before
        with open(Path(output) / "notices.jsonl", "a") as log:
            log.write(json.dumps({"attempt": int(os.environ.get("SHARDYARD_ATTEMPT", "0")), **line}) + "\n")


def work(rounds: int, step: int) -> None:
    """One step's computation: ``rounds`` SHA-256 rounds."""
    hashlib.pbkdf2_hmac("sha256", str(step).encode(), b"shardyard", rounds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--work", type=int, default=20_000, help="SHA-256 rounds per step")
    args = parser.parse_args()

    notice_name, notice_s = os.environ.get("SHARDYARD_NOTICE_SIGNAL"), os.environ.get("SHARDYARD_NOTICE_S")
    noticed: dict[str, float] = {}
    done = load_step(os.environ.get("SHARDYARD_RESUME_DIR"))

    def on_notice(_signum: int, _frame: object) -> None:
        noticed.setdefault("at", time.monotonic())
        noticed.setdefault("after_step", done)  # the steps complete when it came: what must not be lost

    if notice_name is not None:  # else not run by Shardyard: no notice will come
        notice_signal = signal.Signals[notice_name]
        signal.signal(notice_signal, on_notice)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {notice_signal})  # the runtime starts us with it blocked
    record({"event": "resumed", "step": done, "notice_signal": notice_name, "notice_s": notice_s})
    print(f"starting after step {done}; the notice: {notice_name}, {notice_s} s", flush=True)

    for step in range(done + 1, args.steps + 1):
        work(args.work, step)
        done = step
        if step % 50 == 0:
            print(f"step {step}", flush=True)
        if noticed:
            checkpoint = Path(os.environ.get("SHARDYARD_CHECKPOINT_DIR", "checkpoint"))
            save_step(checkpoint, done)
            took = time.monotonic() - noticed["at"]
            record({"event": "noticed", "after_step": int(noticed["after_step"]), "saved_step": done, "took_s": took})
            print(f"notice after step {int(noticed['after_step'])}: saved step {done} in {took:.3f} s", flush=True)
            return PREEMPTED
    print(f"done: {done} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
