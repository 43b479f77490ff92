"""Wiring of the node agent: one per node."""

import os
import sys
from pathlib import Path

from faststream import FastStream
from pydantic import Field

from shardyard.bus.admin import ensure_topics
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.topics import ASSIGNMENTS
from shardyard.clock import Clock
from shardyard.gpus import catalogue_with
from shardyard.node_agent.book import AgentBook
from shardyard.node_agent.handlers import AgentHandlers, NodeIdentity
from shardyard.node_agent.inventory import GpuProbe, detect
from shardyard.node_agent.launcher import Launcher, SubprocessLauncher
from shardyard.node_agent.mounts import parse_mounts
from shardyard.service import Periodic, announce
from shardyard.settings import GpuFigures, ServiceSettings

SERVICE = "node-agent"


def _host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class AgentSettings(ServiceSettings):
    """A node agent: GPU inventory, heartbeats, and the shard processes of its assignments."""

    node_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    gpus: list[str] = Field(default_factory=list, description="simulated GPUs when NVML finds none, e.g. A100:2")
    gpu_tflops: GpuFigures = Field(default_factory=list, description="catalogue overrides, MODEL=TFLOPS")
    cpu_cores: float = Field(default_factory=lambda: float(os.cpu_count() or 1), gt=0)
    memory_gib: float = Field(default_factory=lambda: _host_memory() / 1024**3, gt=0)
    mounts: list[str] = Field(default_factory=list, description="JOB_PREFIX=LOCAL_DIR, e.g. /data=./data")
    address: str = "127.0.0.1"
    rendezvous_port_base: int = Field(default=29500, gt=0, lt=65000)
    rendezvous_port_count: int = Field(default=64, gt=0, le=1000)
    log_dir: Path = Path(".shardyard/logs")
    heartbeat_interval_s: float = Field(default=1.0, gt=0)


def build_app(
    settings: AgentSettings, *, clock: Clock, gpus: GpuProbe | None = None, launcher: Launcher | None = None
) -> FastStream:
    broker = make_broker(settings.bootstrap, client_id=f"{SERVICE}-{settings.node_id}")
    bus = Bus(broker, service=SERVICE)
    identity = NodeIdentity(
        node_id=settings.node_id,
        instance=settings.instance,
        address=settings.address,
        rendezvous_ports=(settings.rendezvous_port_base, settings.rendezvous_port_count),
        cpu_cores=settings.cpu_cores,
        memory_bytes=int(settings.memory_gib * 1024**3),
        mounts=parse_mounts(settings.mounts),
        log_dir=settings.log_dir.resolve(),
        python=sys.executable,
        base_env={k: v for k, v in os.environ.items() if not k.startswith("SHARDYARD_")},
    )
    handlers = AgentHandlers(
        identity,
        AgentBook(settings.node_id),
        bus,
        clock,
        gpus or detect(settings.gpus, catalogue_with(settings.gpu_tflops)),
        launcher or SubprocessLauncher(),
    )
    # One group per node: every agent reads the whole assignment topic and keeps what names it; committed
    # offsets mean an agent that restarts does not start old assignments again.
    bus.subscribe({ASSIGNMENTS: handlers.on_assignment}, group=f"shardyard-agent-{settings.node_id}")
    beat = Periodic("heartbeat", settings.heartbeat_interval_s, handlers.heartbeat)
    app = FastStream(broker)

    @app.on_startup
    async def topics() -> None:
        await ensure_topics(settings.bootstrap)

    @app.after_startup
    async def ready() -> None:
        beat.start()
        await announce(bus, clock, instance=settings.node_id)

    @app.on_shutdown
    async def stop() -> None:
        await beat.stop()
        await handlers.stop_all()

    return app
