"""Wiring of the autoscaler: it follows the elasticity signals and the node states, and drives one node provider.

It runs as a single process, not as elected replicas: the ``local`` provider's nodes are processes of this host that
only the process which started them (or its restart, from ``autoscale.json``) can stop, and a standby elsewhere could
not; the supervisor of ``up`` restarts it when it dies, and a restarted one takes its nodes back from the provider and
its view of them from the log (node states, recent capacity requests). Its decisions are bounded (``max_nodes``, a
cooldown) and its drains idempotent, so a restart repeats nothing harmful."""

import asyncio
import re
from pathlib import Path
from typing import Literal, Self

from faststream import FastStream
from pydantic import Field, model_validator

from shardyard.autoscale.command import CommandProvider
from shardyard.autoscale.local import LocalProvider
from shardyard.autoscale.provider import NodeProvider
from shardyard.autoscaler.book import AutoscaleBook, AutoscalePolicy
from shardyard.autoscaler.handlers import AutoscalerHandlers
from shardyard.bus.admin import ensure_topics
from shardyard.bus.follow import Follower
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.topics import ELASTICITY, NODE_STATE
from shardyard.clock import Clock
from shardyard.gpus import canonical_model, catalogue_with
from shardyard.service import Periodic, announce
from shardyard.settings import GpuFigures, ServiceSettings

SERVICE = "autoscaler"
NODE_KIND = re.compile(r"^([A-Za-z0-9._-]+):([1-9][0-9]*)$")


class AutoscalerSettings(ServiceSettings):
    """The autoscaler: adds nodes of a GPU model when pending jobs need them (capacity requests) and removes nodes
    that sat idle (reclaim candidates), through a node provider."""

    provider: Literal["local", "command"] = Field(default="local", description="local (node agents here) or command")
    gpus: list[str] = Field(
        min_length=1, description="an allowed GPU model and the GPUs of a node of it, e.g. A100:2 (repeatable)"
    )
    max_nodes: int = Field(default=4, ge=1, description="most nodes it manages at once")
    min_nodes: int = Field(default=0, ge=0, description="it never removes below this many of its nodes")
    cooldown_s: float = Field(default=60.0, ge=0, description="seconds between two scale actions")
    min_lifetime_s: float = Field(default=120.0, ge=0, description="a node added is not removed before this age")
    join_timeout_s: float = Field(
        default=180.0, gt=0, description="a node not ALIVE this long after its addition is removed"
    )
    demand_ttl_s: float = Field(default=120.0, gt=0, description="a capacity request older than this is stale")
    tick_interval_s: float = Field(default=1.0, gt=0, description="how often due decisions are looked for")
    gpu_tflops: GpuFigures = Field(default_factory=list, description="catalogue overrides, MODEL=TFLOPS")
    run_dir: str | None = Field(default=None, description="local: the cluster's run folder")
    rendezvous_port_base: int | None = Field(
        default=None, gt=0, lt=65000, description="local: the first port of its nodes' rendezvous blocks"
    )
    stop_timeout_s: float = Field(default=15.0, gt=0, description="local: SIGKILL an agent not stopped after")
    add_command: str | None = Field(default=None, description="command: run as ADD MODEL GPUS COUNT")
    remove_command: str | None = Field(default=None, description="command: run as REMOVE NODE_ID")
    command_timeout_s: float = Field(default=300.0, gt=0, description="command: a script running longer is killed")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        bad = [kind for kind in self.gpus if not NODE_KIND.match(kind)]
        if bad:
            raise ValueError(f"gpus: MODEL:COUNT, e.g. A100:2 (not {', '.join(bad)})")
        if self.min_nodes > self.max_nodes:
            raise ValueError("min_nodes must not exceed max_nodes")
        if self.provider == "local" and (self.run_dir is None or self.rendezvous_port_base is None):
            raise ValueError("the local provider needs run_dir and rendezvous_port_base")
        if self.provider == "command" and not (self.add_command and self.remove_command):
            raise ValueError("the command provider needs add_command and remove_command")
        return self

    def policy(self) -> AutoscalePolicy:
        kinds = {canonical_model(kind.rpartition(":")[0]): int(kind.rpartition(":")[2]) for kind in self.gpus}
        return AutoscalePolicy(
            node_gpus=kinds,
            max_nodes=self.max_nodes,
            min_nodes=self.min_nodes,
            cooldown_s=self.cooldown_s,
            min_lifetime_s=self.min_lifetime_s,
            join_timeout_s=self.join_timeout_s,
            demand_ttl_s=self.demand_ttl_s,
            tflops=dict(catalogue_with(self.gpu_tflops)),
        )

    def node_provider(self) -> NodeProvider:
        if self.provider == "command":
            assert self.add_command and self.remove_command
            return CommandProvider(self.add_command, self.remove_command, timeout_s=self.command_timeout_s)
        assert self.run_dir is not None and self.rendezvous_port_base is not None
        return LocalProvider(
            Path(self.run_dir), self.rendezvous_port_base, self.max_nodes, stop_timeout_s=self.stop_timeout_s
        )


def build_app(settings: AutoscalerSettings, *, clock: Clock, provider: NodeProvider | None = None) -> FastStream:
    bus = Bus(make_broker(settings.bootstrap, client_id=f"{SERVICE}-{settings.instance}"), service=SERVICE)
    provider = provider or settings.node_provider()
    handlers = AutoscalerHandlers(AutoscaleBook(settings.policy()), provider, bus, clock)
    follower = Follower(
        settings.bootstrap, (ELASTICITY, NODE_STATE), handlers.on_followed, name=f"{SERVICE}-{settings.instance}"
    )
    ticker = Periodic("autoscaler-decisions", settings.tick_interval_s, handlers.tick)
    app = FastStream(bus.broker)

    @app.on_startup
    async def rebuild() -> None:
        await ensure_topics(settings.bootstrap)
        await follower.start()
        await follower.caught_up()
        handlers.live = True

    @app.after_startup
    async def ready() -> None:
        ticker.start()
        await announce(bus, clock, instance=settings.instance)

    @app.on_shutdown
    async def stop() -> None:
        await ticker.stop()
        await follower.stop()
        await asyncio.to_thread(provider.close)

    return app
