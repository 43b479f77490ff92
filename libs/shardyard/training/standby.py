"""``python -m shardyard.training.standby``: a warm shard, started before it has an assignment.

A cold shard spends seconds importing torch and the runner before it can join its gang (2.5-3 s on a busy 2-core
host), and a re-formed gang waits for its slowest member. The node agent therefore starts standbys where a shard is
likely to be needed soon: one per spare it holds, and one when a shard of a job ends with a failure the job recovers
from (its gang is about to be re-formed, most often on the same nodes). A standby imports what a shard needs and
then waits on its standard input for one line, its order:

``{"env": {...}, "log": "/path/to/shard-0-attempt-2.log"}``

It then writes to that log, takes that environment (its progress channel, inherited at start, stays the same) and
runs as ``python -m shardyard.training.shard`` would: the lease watchdog first, then the runner. End of input
without an order (the agent discarded it) ends it with exit code 0, having trained nothing.

A standby runs no attempt of anything before its order, so it needs no fencing; like every shard it is bound to
its agent's life (``PR_SET_PDEATHSIG``), and the agent ends it when the job ends or the standby outlives its use.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Final

from shardyard.errors import ShardyardError
from shardyard.training import exitcodes
from shardyard.training.entry import PROGRESS_FD_ENV

MODULE: Final = "shardyard.training.standby"


class OrderError(ShardyardError, ValueError):
    """The agent's order is not what this module reads."""


@dataclass(frozen=True)
class Order:
    env: Mapping[str, str]
    log: str

    def encode(self) -> bytes:
        return json.dumps({"env": dict(self.env), "log": self.log}).encode() + b"\n"

    @classmethod
    def decode(cls, line: bytes) -> Order:
        try:
            raw = json.loads(line)
        except ValueError as exc:
            raise OrderError(f"not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise OrderError("not a JSON object")
        env, log = raw.get("env"), raw.get("log")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise OrderError("'env' must map names to strings")
        if not isinstance(log, str) or not log:
            raise OrderError("'log' must be a path")
        return cls(env=env, log=log)


def warm_up() -> None:
    """Everything a cold shard imports before its first step, and the first op's lazy initialisation. CUDA is not
    touched: a process that initialised it cannot have ``CUDA_VISIBLE_DEVICES`` changed by its order."""
    import torch
    import torch.distributed
    import torch.nn.functional as F

    import shardyard.training.runner  # noqa: F401

    torch.set_num_threads(1)
    x = torch.ones(4, 4, requires_grad=True)
    F.cross_entropy(x @ x, torch.zeros(4, dtype=torch.long)).backward()
    # The optimizer's first construction imports torch._dynamo: 1.5 s on an idle host, 2.5-4.5 s on a busy one, on
    # the path of every re-formed gang (measured between the rendezvous and the first step).
    torch.optim.AdamW([x], lr=1e-3).step()


def redirect_output(log: str) -> None:
    """From now on the process's stdout and stderr (both file descriptors, so torch's C++ logs too) go to ``log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # the agent made it, for this process's user
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def take_order(order: Order) -> None:
    """Become the shard the order describes: its log, its environment (keeping the progress channel this process
    was started with)."""
    progress_fd = os.environ.get(PROGRESS_FD_ENV)
    redirect_output(order.log)
    os.environ.clear()
    os.environ.update(order.env)
    if progress_fd is not None:
        os.environ[PROGRESS_FD_ENV] = progress_fd


def wait_for_order(stdin: IO[bytes]) -> Order | None:
    line = stdin.readline()
    return Order.decode(line) if line.strip() else None


def main() -> int:
    warm_up()
    print(f"shardyard standby: warm (pid {os.getpid()}), waiting for an order", file=sys.stderr, flush=True)
    try:
        order = wait_for_order(sys.stdin.buffer)
    except OrderError as exc:
        print(f"shardyard standby: bad order: {exc}", file=sys.stderr, flush=True)
        return exitcodes.INTERNAL_ERROR
    if order is None:
        return 0
    take_order(order)
    sys.stdin.close()
    from shardyard.training import shard

    return shard.main()


if __name__ == "__main__":
    sys.exit(main())
