"""The gang's listeners bind the address the agent advertises, never every interface: rank 0's store listens on
MASTER_ADDR:MASTER_PORT only (the built-in runner's, and the one rank 0's supervisor hosts for a job's own script),
and gloo's connections on the interface the agent names (GLOO_SOCKET_IFNAME). What listens is read from the
kernel's socket tables (``/proc/net/tcp*``) for the processes' own sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shardyard.training.artifacts import DemoArtifacts, create_demo_artifacts
from shardyard.training.config import RunConfig
from shardyard.training.model import TinyGPTConfig
from shardyard.training.rendezvous import gang_store, listen
from shardyard.training.store import AGENT_STORE_ENV, RESTART_COUNT_ENV
from tests.support.runners import runners, train_env, until

ADVERTISED = "127.0.0.2"  # on lo, but not the address a host name or a wildcard bind would give
WILDCARDS = {"0.0.0.0", "::"}


def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(status.split("PPid:")[1].split()[0])
    tree, grown = {pid}, True
    while grown:
        below = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= below
        grown = bool(below)
    return tree


def listening(*pids: int) -> set[tuple[str, int]]:
    """The (address, port) pairs processes ``pids`` listen on over TCP."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # 32-bit words, host order
            found.add((socket.inet_ntop(family, packed), int(port, 16)))
    return found


def config(**fields: str) -> RunConfig:
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": ADVERTISED, "MASTER_PORT": "1"}
    paths = {f"SHARDYARD_{name}_DIR": "/nonexistent" for name in ("MODEL", "DATASET", "OUTPUT")}
    knobs = {"SHARDYARD_SYNC_INTERVAL": "1", "SHARDYARD_MAX_STEPS": "1", "SHARDYARD_BATCH_SIZE": "1"}
    knobs |= {"SHARDYARD_SEQ_LEN": "1", "SHARDYARD_LR": "0.1", "SHARDYARD_SEED": "0"}
    return RunConfig.from_env({**env, **paths, **knobs, **fields})


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def test_listen_binds_exactly_the_address() -> None:
    with listen(ADVERTISED, 0) as server:
        assert server.getsockname()[0] == ADVERTISED


def test_the_store_of_rank_0_listens_on_the_master_address_only() -> None:
    port = free_port(ADVERTISED)

    store = gang_store(config(MASTER_PORT=str(port)))
    store.set("k", "v")

    mine = {entry for entry in listening(os.getpid()) if entry[1] == port}
    assert mine == {(ADVERTISED, port)}
    del store


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> DemoArtifacts:
    tiny = TinyGPTConfig(n_positions=64, n_embd=32, n_layer=1, n_head=2)
    return create_demo_artifacts(tmp_path_factory.mktemp("data"), seed=0, model_config=tiny)


def test_a_training_gang_listens_only_on_the_advertised_interface(artifacts: DemoArtifacts, tmp_path: Path) -> None:
    env = train_env(artifacts, tmp_path / "out", SHARDYARD_DEVICE="cpu", SHARDYARD_MAX_STEPS="1000000")
    with runners(tmp_path) as launch:
        shards = launch(2, {**env, "MASTER_ADDR": ADVERTISED, "GLOO_SOCKET_IFNAME": "lo"})
        until(lambda: all(shard.progress() for shard in shards), 120, "both ranks training")
        listeners = {shard.rank: listening(shard.proc.pid) for shard in shards}

    assert any(address == ADVERTISED for address, _ in listeners[0]), listeners  # the store (gloo's are on .1)
    every = set().union(*listeners.values())
    assert every and not {address for address, _ in every} & WILDCARDS, listeners
    assert {address for address, _ in every} <= {ADVERTISED, "127.0.0.1"}, listeners  # lo's own address: gloo's


# A job's own script as users write them: env:// from the torchrun variables. It says it is up, then waits for the
# test (with a deadline).
DDP_SCRIPT = textwrap.dedent(
    """
    import os, pathlib, sys, time
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    folder = pathlib.Path(sys.argv[1])
    (folder / f"up-{dist.get_rank()}").write_text(str(total.item()))
    deadline = time.monotonic() + 60
    while not (folder / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    dist.destroy_process_group()
    """
)


def test_a_jobs_own_script_rendezvous_at_the_store_rank_0s_supervisor_hosts(tmp_path: Path) -> None:
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    port = free_port(ADVERTISED)
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": ADVERTISED, "MASTER_PORT": str(port)}
    env |= {AGENT_STORE_ENV: "True", RESTART_COUNT_ENV: "0", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "shardyard.training.entry", "--", sys.executable, str(script), str(tmp_path)]
    ranks = [
        subprocess.Popen(command, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, stderr=subprocess.PIPE)
        for rank in (0, 1)
    ]
    try:
        until(lambda: all((tmp_path / f"up-{rank}").exists() for rank in (0, 1)), 120, "both ranks past the rendezvous")
        listeners = {rank: listening(*descendants(proc.pid)) for rank, proc in enumerate(ranks)}
        (tmp_path / "release").touch()
        codes = [proc.wait(timeout=60) for proc in ranks]
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()

    assert codes == [0, 0], [proc.stderr.read() if proc.stderr else "" for proc in ranks]
    assert (tmp_path / "up-0").read_text() == "2.0"
    assert (ADVERTISED, port) in listeners[0] and (ADVERTISED, port) not in listeners[1], listeners
    every = set().union(*listeners.values())
    assert not {address for address, _ in every} & WILDCARDS, listeners
