"""Where a shard computes and how it joins its gang.

One GPU per shard: with CUDA present the shard trains on ``cuda:LOCAL_RANK`` (the node agent sets ``LOCAL_RANK`` to
the index of the GPU it assigned, with every GPU visible; torchrun to the process's index on the node) and the gang
talks NCCL; without CUDA it trains on the CPU and talks gloo. ``SHARDYARD_DEVICE`` (``auto``, ``cpu``, ``cuda``)
can insist on one. The parameter or gradient syncs use a group of their own whose collectives time out after
``sync_timeout_s``; the rendezvous and the barriers keep ``dist_timeout_s``.

The gang's store (the rendezvous) is served by rank 0 on ``MASTER_ADDR:MASTER_PORT`` and on that address only: the
agent sets MASTER_ADDR to the coordinator node's advertised address, and torch's own store would listen on every
interface of the host. So rank 0 binds the listening socket itself and hands it to the store. (gloo and NCCL open
their own listeners, on the interface the agent names in ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``.)

Under torchrun the store is already there: its elastic agent serves it on MASTER_ADDR:MASTER_PORT and says so with
``TORCHELASTIC_USE_AGENT_STORE=True`` (``RunConfig.agent_store``). Every rank, rank 0 included, is then a client of
it, as torch's own ``env://`` rendezvous does; a rank 0 that bound the port would fail with "Address already in use".
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from shardyard.training.config import Device, RunConfig
from shardyard.training.errors import DeviceError, comm


@dataclass(frozen=True)
class Placement:
    device: torch.device
    backend: str
    """The torch.distributed backend: ``nccl`` on a GPU, ``gloo`` on the CPU."""


def cuda_devices() -> int:
    """The CUDA devices this process sees (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_placement(device: Device, local_rank: int, gpus: int) -> Placement:
    """The device and backend of the shard with ``local_rank`` on a node where it sees ``gpus`` CUDA devices."""
    if device == "cpu" or (device == "auto" and gpus == 0):
        return Placement(torch.device("cpu"), "gloo")
    if gpus == 0:
        raise DeviceError("SHARDYARD_DEVICE=cuda, but CUDA is not available")
    if local_rank >= gpus:
        raise DeviceError(f"LOCAL_RANK={local_rank} names GPU {local_rank}, but only {gpus} CUDA devices are visible")
    return Placement(torch.device("cuda", local_rank), "nccl")


def place(cfg: RunConfig) -> Placement:
    """Choose this shard's device and make it the current one."""
    placement = choose_placement(cfg.device, cfg.local_rank, cuda_devices())
    if placement.device.type == "cuda":
        torch.cuda.set_device(placement.device)
    return placement


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on exactly ``host:port`` (a host name is resolved: its first address), never on every
    interface. OSError when the address is not this host's or the port is taken."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family, backlog=socket.SOMAXCONN)


def gang_store(cfg: RunConfig) -> dist.TCPStore:
    """The gang's store: served by rank 0 on ``MASTER_ADDR:MASTER_PORT`` only (see :func:`listen`), a client of it
    on the other ranks. Rank 0 waits for the others to join, up to ``dist_timeout_s``. Where a launcher serves it
    (``cfg.agent_store``: torchrun), every rank is a client."""
    timeout = timedelta(seconds=cfg.dist_timeout_s)
    if cfg.rank != 0 or cfg.agent_store:
        return dist.TCPStore(cfg.master_addr, cfg.master_port, cfg.world_size, is_master=False, timeout=timeout)
    server = listen(cfg.master_addr, cfg.master_port)
    return dist.TCPStore(
        cfg.master_addr,
        cfg.master_port,
        cfg.world_size,
        is_master=True,
        timeout=timeout,
        master_listen_fd=server.detach(),  # the store owns the socket from here
    )


def init_process_group(cfg: RunConfig, placement: Placement) -> tuple[dist.ProcessGroup, dist.Store]:
    """The default group (rendezvous, barriers: ``dist_timeout_s``) and the group the syncs use, whose collectives
    time out after ``sync_timeout_s``; and the gang's store (the ranks agree there where to stop on a notice:
    :mod:`shardyard.training.notice`)."""
    os.environ.update(MASTER_ADDR=cfg.master_addr, MASTER_PORT=str(cfg.master_port))
    where = f"{cfg.master_addr}:{cfg.master_port}, world_size={cfg.world_size}"
    with comm(f"init_process_group({placement.backend}, {where})"):
        store = gang_store(cfg)
        dist.init_process_group(
            placement.backend,
            store=store,
            rank=cfg.rank,
            world_size=cfg.world_size,
            timeout=timedelta(seconds=cfg.dist_timeout_s),
            device_id=placement.device if placement.device.type == "cuda" else None,
        )
        group = dist.new_group(timeout=timedelta(seconds=cfg.sync_timeout_s))
    assert group is not None  # every rank is a member
    return group, store
