"""Wiring of the node agent: one per node."""

import asyncio
import logging
import os
import pwd
import socket
import sys
from pathlib import Path
from typing import Self

from faststream import FastStream
from pydantic import Field, model_validator

from shardyard.bus.admin import ensure_topics
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.replay import replay
from shardyard.bus.topics import ASSIGNMENTS, LIFECYCLE, NODE_STATE, Topic
from shardyard.clock import Clock
from shardyard.errors import ConfigError
from shardyard.events import NodeState
from shardyard.gpus import catalogue_with
from shardyard.lifecycle import TERMINAL, LifecycleFact, target_state
from shardyard.liveness import LoopLag
from shardyard.netprobe import MAX_BURST_BYTES, bind_endpoint
from shardyard.node_agent.artifacts import ArtifactWatch
from shardyard.node_agent.beats import DEFAULT_REFRESH_S
from shardyard.node_agent.benchmark import (
    DEFAULT_SECONDS,
    DEFAULT_SIZE,
    GpuBench,
    MatmulDtype,
    MeasureMode,
    SubprocessBench,
    calibrate,
)
from shardyard.node_agent.book import AgentBook
from shardyard.node_agent.disk import DEFAULT_OUTPUT_PATH
from shardyard.node_agent.environment import RunnerOptions, RunnerSettings, agent_base_env
from shardyard.node_agent.fencing import CHECK_INTERVAL_S, DEFAULT_LEASE_S
from shardyard.node_agent.handlers import AgentHandlers
from shardyard.node_agent.identity import NodeIdentity
from shardyard.node_agent.interfaces import advertised_interface
from shardyard.node_agent.inventory import GpuProbe, GpuProbeChoice, MeasuredTflops, detect
from shardyard.node_agent.launcher import Launcher, SubprocessLauncher
from shardyard.node_agent.links import LinkProber, ProbeSettings, Probing, probing_parts
from shardyard.node_agent.load import LoadSetting, load_source
from shardyard.node_agent.mounts import PathProbe, parse_mounts, parse_shared_mounts
from shardyard.node_agent.private_files import interpreter_unreachable
from shardyard.node_agent.shard_users import (
    AS_AGENT,
    DEFAULT_UID_BASE,
    DEFAULT_UID_COUNT,
    PER_JOB,
    ShardUsers,
    choose,
)
from shardyard.node_agent.warm import DEFAULT_GANG_AFTER_S, DEFAULT_TTL_S, Mode
from shardyard.secret_env import agents_key_from_env
from shardyard.service import Periodic, announce
from shardyard.settings import GpuFigures, ServiceSettings
from shardyard.training.lease import DEFAULT_SHARD_LEASE_S

SERVICE = "node-agent"

log = logging.getLogger(__name__)


def _host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class AgentSettings(ServiceSettings, RunnerSettings):
    """A node agent: GPU inventory, heartbeats, and the shard processes of its assignments."""

    node_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    gpus: list[str] = Field(default_factory=list, description="simulated GPUs when NVML finds none, e.g. A100:2")
    gpu_probe: GpuProbeChoice = Field(default="auto", description="auto (NVML, else --gpus), simulated (--gpus), nvml")
    gpu_tflops: GpuFigures = Field(default_factory=list, description="catalogue overrides, MODEL=TFLOPS")
    measure_tflops: MeasureMode = Field(
        default="auto", description="benchmark the GPUs at start-up: auto (real GPUs only), on, off"
    )
    tflops_dtype: MatmulDtype = Field(default="float32", description="benchmark precision: float32, tf32, bfloat16...")
    tflops_size: int = Field(default=DEFAULT_SIZE, ge=64, le=32768, description="benchmark matrix size (n x n)")
    tflops_seconds: float = Field(default=DEFAULT_SECONDS, gt=0, le=10, description="benchmark time per GPU")
    cpu_cores: float = Field(default_factory=lambda: float(os.cpu_count() or 1), gt=0)
    memory_gib: float = Field(default_factory=lambda: _host_memory() / 1024**3, gt=0)
    load_source: LoadSetting = Field(
        default="auto", description="cpu_load from the host load average or this node's shards; auto: by GPU kind"
    )
    mounts: list[str] = Field(default_factory=list, description="JOB_PREFIX=LOCAL_DIR, e.g. /data=./data")
    shared_mounts: list[str] = Field(
        default_factory=list, description="job path prefixes on network filesystems all nodes share, e.g. /data/shared"
    )
    artifact_poll_s: float = Field(default=0.25, gt=0, description="how often absent watched artifacts are looked for")
    output_path: str = Field(
        default=DEFAULT_OUTPUT_PATH, description="job path of outputs and checkpoints: heartbeats report its free space"
    )
    zone: str = Field(default="", description="topology label: availability zone")
    rack: str = Field(default="", description="topology label: rack")
    address: str = "127.0.0.1"
    rendezvous_port_base: int = Field(default=29500, gt=0, lt=65000)
    rendezvous_port_count: int = Field(default=64, gt=0, le=1000)
    log_dir: Path = Path(".shardyard/logs")
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    status_refresh_s: float = Field(default=DEFAULT_REFRESH_S, gt=0, description="full heartbeat this often at least")
    lease_s: float = Field(
        default=DEFAULT_LEASE_S,
        gt=0,
        description="stop every shard when no heartbeat reached the bus for this long (below the pool's LOST bound)",
    )
    shard_lease_s: float = Field(
        default=DEFAULT_SHARD_LEASE_S,
        gt=0,
        description="shards stop by themselves when the agent renewed nothing for this long (below the pool's SUSPECT)",
    )
    standbys: Mode = Field(
        default="gang",
        description="warm shard processes (torch imported): none; spares (one per spare held, one after a recoverable"
        " failure); gang (also one per training shard of a multi-shard job)",
    )
    standby_ttl_s: float = Field(
        default=DEFAULT_TTL_S,
        gt=0,
        description="how long an unused standby lives once its job holds no spare and runs no shard here",
    )
    standby_after_s: float = Field(
        default=DEFAULT_GANG_AFTER_S,
        ge=0,
        description="standbys=gang: how long a shard trains before its standby is started",
    )
    peer_state: bool = Field(
        default=True,
        description="a failing shard keeps its gang's state of the last sync on this node, for the re-formed gang"
        " to resume from (work lost: at most one sync interval, however seldom the gang checkpoints)",
    )
    peer_state_dir: Path | None = Field(
        default=None, description="where shards keep that state (node-local); default: <log-dir>/peer-state/<node-id>"
    )
    shard_user: str = Field(
        default=PER_JOB,
        min_length=1,
        description="who shards run as when the agent is root: job (a uid/gid of each job's own, from"
        " shard-uid-base), agent (the agent's own user: no isolation), or a user name or uid (all shards as it)",
    )
    shard_uid_base: int = Field(default=DEFAULT_UID_BASE, ge=1, description="shard-user=job: the first uid/gid")
    shard_uid_count: int = Field(
        default=DEFAULT_UID_COUNT, ge=1, description="shard-user=job: how many uids/gids from shard-uid-base"
    )
    probe_links: bool = Field(
        default=True,
        description="measure this node's links (RTT, bandwidth) to its gang peers and a rotating sample of others;"
        " the probe endpoint takes the last port of the rendezvous range",
    )
    probe_interval_s: float = Field(default=ProbeSettings.interval_s, gt=0, description="one probe round this often")
    probe_sample: int = Field(
        default=ProbeSettings.sample, ge=0, le=1000, description="peers probed a round beyond the gang peers"
    )
    probe_burst_bytes: int = Field(
        default=ProbeSettings.burst_bytes,
        ge=0,
        le=MAX_BURST_BYTES,
        description="bytes of one throughput burst (0: no bandwidth measurement)",
    )
    probe_burst_every_s: float = Field(
        default=ProbeSettings.burst_every_s, gt=0, description="a link without a gang gets a burst at most this often"
    )
    scratch_dir: Path | None = Field(
        default=None,
        description="where shards under a user of their own get a private HOME and TMPDIR, one directory per job"
        " (node-local); default: <log-dir>/scratch/<node-id>",
    )

    @model_validator(mode="after")
    def _lease_outlasts_a_heartbeat(self) -> Self:
        if self.lease_s <= self.heartbeat_interval_s:
            raise ValueError(f"lease_s ({self.lease_s}) must exceed heartbeat_interval_s ({self.heartbeat_interval_s})")
        return self

    @model_validator(mode="after")
    def _probe_port_leaves_a_rendezvous_port(self) -> Self:
        if self.probe_links and self.rendezvous_port_count < 2:
            raise ValueError("probe_links takes the last rendezvous port: rendezvous_port_count must be at least 2")
        return self

    @model_validator(mode="after")
    def _uids_fit(self) -> Self:
        if self.shard_uid_base + self.shard_uid_count > 2**31:
            raise ValueError(
                f"shard_uid_base + shard_uid_count ({self.shard_uid_base + self.shard_uid_count}) must not exceed 2**31"
            )
        return self


def _peer_state_dir(settings: AgentSettings) -> str | None:
    if not settings.peer_state:
        return None
    chosen = settings.peer_state_dir or settings.log_dir / "peer-state" / settings.node_id
    return str(chosen.resolve())


def _shard_users(settings: AgentSettings) -> ShardUsers:
    def lookup(name: str) -> tuple[int, int]:
        entry = pwd.getpwnam(name)
        return entry.pw_uid, entry.pw_gid

    users = choose(
        settings.shard_user,
        base=settings.shard_uid_base,
        count=settings.shard_uid_count,
        agent_uid=os.geteuid(),
        lookup=lookup,
    )
    if not users.isolated:
        say = log.info if settings.shard_user == AS_AGENT else log.warning  # else: not root, it cannot switch
        say("shards run as the agent's own user (uid %d): jobs can read each other's files", os.geteuid())
        return users
    probe = users.of(settings.node_id)
    assert probe is not None  # isolated
    why = interpreter_unreachable(Path(sys.executable), Path(os.__file__).parent, probe)
    if why is not None:
        raise ConfigError(
            f"shard_user {settings.shard_user!r}: shards could not start Python as a user of their own ({why}); install"
            " Shardyard where every user can read it, or run shards as the agent: --shard-user agent"
            " (SHARDYARD_SHARD_USER=agent)"
        )
    return users


def topology(zone: str, rack: str) -> dict[str, str]:
    labels: dict[str, str] = {"zone": zone, "rack": rack}
    return {name: value for name, value in labels.items() if value}


def _identity(settings: AgentSettings, probe: GpuProbe, probe_port: int | None) -> NodeIdentity:
    return NodeIdentity(
        node_id=settings.node_id,
        instance=settings.instance,
        address=settings.address,
        rendezvous_ports=(settings.rendezvous_port_base, settings.rendezvous_port_count - settings.probe_links),
        probe_port=probe_port,
        env_key=agents_key_from_env(),
        cpu_cores=settings.cpu_cores,
        memory_bytes=int(settings.memory_gib * 1024**3),
        mounts=parse_mounts(settings.mounts),
        log_dir=settings.log_dir.resolve(),
        python=sys.executable,
        base_env=agent_base_env(os.environ),
        load_source=load_source(settings.load_source, simulated=probe.simulated),
        topology=topology(settings.zone, settings.rack),
        runner=RunnerOptions(
            checkpoint_every=settings.checkpoint_every,
            sync_timeout_s=settings.sync_timeout_s,
            slow_sync_factor=settings.slow_sync_factor,
            step_log_every_s=settings.step_log_every_s,
            lease_file=str(settings.log_dir.resolve() / f"{settings.node_id}.lease"),
            shard_lease_s=settings.shard_lease_s,
            peer_state_dir=_peer_state_dir(settings),
            socket_ifname=advertised_interface(settings.address),
        ),
        standbys=settings.standbys,
        standby_ttl_s=settings.standby_ttl_s,
        standby_after_s=settings.standby_after_s,
        status_refresh_s=settings.status_refresh_s,
        shard_users=_shard_users(settings),
        scratch_dir=(settings.scratch_dir or settings.log_dir / "scratch" / settings.node_id).resolve(),
        output_path=settings.output_path,
    )


def _subscribe(bus: Bus, settings: AgentSettings, handlers: AgentHandlers, prober: LinkProber | None) -> None:
    # One group per node: every agent reads the whole assignment topic and keeps what names it; committed
    # offsets mean an agent that restarts does not start old assignments again.
    group = f"shardyard-agent-{settings.node_id}"

    async def on_assignment(event: object) -> None:
        if prober is not None:
            prober.on_assignment(event)  # every node's assignments: who shares a gang with this node
        await handlers.on_assignment(event)

    async def on_lifecycle(event: LifecycleFact) -> None:
        if prober is not None and target_state(event) in TERMINAL:
            prober.job_ended(event.job_id)
        await handlers.on_lifecycle(event)

    bus.subscribe({ASSIGNMENTS: on_assignment}, group=group, job_path=True)
    # Lifecycle facts are read in full by every agent (no group): each watches the artifacts of every live job.
    bus.subscribe({LIFECYCLE: on_lifecycle}, group=None)
    if prober is not None:
        # The node directory the prober picks its peers from: every node's state, read whole.
        async def on_node_state(event: NodeState) -> None:
            prober.on_node_state(event)

        bus.subscribe({NODE_STATE: on_node_state}, group=None)


def _periodic_work(
    app: FastStream, settings: AgentSettings, handlers: AgentHandlers, bus: Bus, clock: Clock, probing: list[Periodic]
) -> None:
    """Heartbeats, artifact polls, the lease check and the link probes, from the app's start to its shutdown."""
    beat = Periodic("heartbeat", settings.heartbeat_interval_s, handlers.heartbeat)
    poll = Periodic("artifact-poll", settings.artifact_poll_s, handlers.poll_artifacts)
    fence = Periodic("self-fence", CHECK_INTERVAL_S, handlers.check_lease)
    work: list[Periodic | LoopLag] = [handlers.heartbeats.loop_lag, fence, poll, beat, *probing]

    @app.after_startup
    async def ready() -> None:
        handlers.start_lease()
        for periodic in work:
            periodic.start()
        await announce(bus, clock, instance=settings.node_id)

    @app.on_shutdown
    async def stop() -> None:
        for periodic in reversed(work):
            await periodic.stop()
        await handlers.stop_all()


def _probing(
    settings: AgentSettings, endpoint: socket.socket | None, bus: Bus, clock: Clock, book: AgentBook
) -> Probing:
    """The link prober, its periodic rounds and its endpoint; no prober with ``--probe-links false``."""
    if endpoint is None:
        return None, [], None
    knobs = ProbeSettings(
        interval_s=settings.probe_interval_s,
        sample=settings.probe_sample,
        burst_bytes=settings.probe_burst_bytes,
        burst_every_s=settings.probe_burst_every_s,
    )
    running = lambda: {job for job, _shard, _attempt in book.running}  # noqa: E731 - the book's jobs, when asked
    return probing_parts(LinkProber(settings.node_id, bus, clock, knobs, running=running), endpoint)


def build_app(
    settings: AgentSettings,
    *,
    clock: Clock,
    gpus: GpuProbe | None = None,
    launcher: Launcher | None = None,
    bench: GpuBench | None = None,
    disk: PathProbe | None = None,
) -> FastStream:
    broker = make_broker(settings.bootstrap, client_id=f"{SERVICE}-{settings.node_id}")
    bus = Bus(broker, service=SERVICE, component=settings.node_id)  # sealed with the node's key
    probe = gpus or detect(settings.gpus, catalogue_with(settings.gpu_tflops), choice=settings.gpu_probe)
    measured = MeasuredTflops(probe)
    bench = bench or SubprocessBench(
        sys.executable, size=settings.tflops_size, dtype=settings.tflops_dtype, seconds=settings.tflops_seconds
    )
    last_port = settings.rendezvous_port_base + settings.rendezvous_port_count - 1  # the probe's, documented
    bound = bind_endpoint(settings.address, last_port) if settings.probe_links else None
    identity = _identity(settings, probe, bound.getsockname()[1] if bound is not None else None)
    watch = ArtifactWatch(shared_prefixes=parse_shared_mounts(settings.shared_mounts))
    book = AgentBook(settings.node_id, env_key=identity.env_key)
    prober, probing, endpoint = _probing(settings, bound, bus, clock, book)
    handlers = AgentHandlers(
        identity,
        book,
        bus,
        clock,
        measured,
        launcher or SubprocessLauncher(),
        watch=watch,
        disk=disk,
        lease_s=settings.lease_s,
    )
    _subscribe(bus, settings, handlers, prober)
    app = FastStream(broker)

    def restore(_topic: Topic, event: LifecycleFact) -> None:
        watch.apply(event)  # no stat yet: the first heartbeat looks at every watched path

    @app.on_startup
    async def prepare() -> None:
        await ensure_topics(settings.bootstrap)
        _, figures = await asyncio.gather(
            replay(settings.bootstrap, [LIFECYCLE], restore), calibrate(settings.measure_tflops, probe, bench)
        )
        measured.figures.update(figures)
        if endpoint is not None:
            await endpoint.start()

    @app.after_shutdown
    async def close_endpoint() -> None:
        if endpoint is not None:
            await endpoint.stop()

    _periodic_work(app, settings, handlers, bus, clock, probing)
    return app
