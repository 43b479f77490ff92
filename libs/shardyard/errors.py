"""Shardyard's exception tree. Foreign errors are translated at the boundary with ``raise X from exc``.

ShardyardError
├── ConfigError            settings or a command line that cannot be used
├── BrokerError            the Kafka-compatible broker cannot be started, reached or used
│   └── BrokerStartError   the embedded broker did not become ready
├── EventDecodeError       bytes on a topic that are not a valid event of that topic
├── ClusterError           a local cluster (``shardyard up``) is missing, half-started or unhealthy
├── JobPathError           a job path a node will not map to its disk: not absolute, not normalised, not mounted
├── AccountingError        the job accounting database cannot be opened, written or read (``shardyard.jobdb``)
│
│   Where they are raised (each module keeps its own):
├── training.config.ConfigError   a shard's environment is missing a variable or holds a bad value (a ConfigError)
├── training.errors.UserError     what the user supplied cannot be trained on: exit USER_ERROR
├── training.errors.DeviceError   the shard's GPU is not visible to it: exit GPU_FAULT
├── training.errors.CommError     a torch.distributed failure: exit COMM_ERROR
│   └── SyncTimeoutError          a sync past its timeout: exit SYNC_TIMEOUT
├── training.model.CheckpointError, training.data.DatasetError, training.entry.UsageError,
│   training.standby.OrderError   a checkpoint, dataset, entrypoint command line or standby order that cannot be used
├── sim.trace.TraceError, sim.engine.SimulationError   a trace or a simulation that cannot be run
└── node_agent.book.NotRunning    an agent asked to end a shard attempt that is not running (also a KeyError)
"""


class ShardyardError(Exception):
    """Base of every error Shardyard raises on purpose."""


class ConfigError(ShardyardError):
    """Settings or arguments that cannot be used."""


class BrokerError(ShardyardError):
    """The broker cannot be started, reached or used."""


class BrokerStartError(BrokerError):
    """The embedded broker process did not become ready."""


class EventDecodeError(ShardyardError):
    """A message that does not decode into an event of its topic."""


class ClusterError(ShardyardError):
    """A local cluster is missing, half-started or unhealthy."""


class NeverFits(ClusterError):
    """A job ``submit --wait`` follows has waited ``NEVER_FITS`` (no set of the cluster's nodes could hold it) for
    ``--wait-timeout``: it stays queued; the wait gives up, with the scheduler's reason."""

    def __init__(self, job_id: str, message: str, waited_s: float) -> None:
        super().__init__(f"job {job_id} cannot fit this cluster as it is (NEVER_FITS for {waited_s:.0f}s): {message}")
        self.job_id = job_id


class JobPathError(ShardyardError):
    """A path a job names that this node does not serve: it is never looked at or opened here."""


class AccountingError(ShardyardError):
    """The job accounting database cannot be opened, written or read (or holds no accounting table yet)."""
