"""``python -m shardyard.training.store``: the rendezvous store of a job's own script, served on the advertised
address only.

A script that calls ``torch.distributed.init_process_group`` (``env://`` or ``tcp://``) makes rank 0 serve the
gang's store on MASTER_PORT, and torch's store listens on every interface of the host. So the node agent runs a
multi-shard job's own command as torchrun runs its workers: with ``TORCHELASTIC_USE_AGENT_STORE=True``, every rank a
client of a store that the runtime hosts. The supervisor of rank 0 (:mod:`shardyard.training.entry`) starts this
module beside the script; it binds MASTER_ADDR:MASTER_PORT itself (:func:`shardyard.training.rendezvous.listen`),
serves the store there until its standard input closes (the supervisor ended) and exits 0. One that cannot listen
says why on stderr (the shard's log) and exits ``COMM_ERROR``; the script then fails its rendezvous.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from datetime import timedelta
from typing import IO, Final

from shardyard.training import exitcodes
from shardyard.training.config import AGENT_STORE_ENV

# AGENT_STORE_ENV is defined with the runner's configuration, which reads it too (a built-in runner under torchrun).
__all__ = ["AGENT_STORE_ENV", "MODULE", "RESTART_COUNT_ENV", "main", "serve"]

MODULE: Final = "shardyard.training.store"
RESTART_COUNT_ENV: Final = "TORCHELASTIC_RESTART_COUNT"
"""Read by older torch releases in agent-store mode (the prefix of the store's keys): every rank sets it alike."""


def serve(env: Mapping[str, str], until_closed: IO[bytes]) -> int:
    import torch.distributed as dist

    from shardyard.training.rendezvous import listen

    host, port, world_size = env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"])
    try:
        server = listen(host, port)
    except OSError as exc:
        print(f"shardyard store: cannot listen on {host}:{port}: {exc}", file=sys.stderr, flush=True)
        return exitcodes.COMM_ERROR
    store = dist.TCPStore(
        host,
        port,
        world_size,
        is_master=True,
        timeout=timedelta(hours=1),
        wait_for_workers=False,
        master_listen_fd=server.detach(),
    )
    until_closed.read()  # the supervisor holds the other end: it ended, or is done with the store
    del store
    return 0


def main() -> int:
    return serve(os.environ, sys.stdin.buffer)


if __name__ == "__main__":
    sys.exit(main())
