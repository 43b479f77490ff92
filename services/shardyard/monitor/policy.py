"""The alert rules' thresholds and ``for`` durations (``MonitorSettings.alert_policy`` sets each one)."""

from dataclasses import dataclass

from shardyard.units import format_bytes


@dataclass(frozen=True)
class AlertPolicy:
    """Thresholds and ``for`` durations of the rules (from MonitorSettings), and whose consumer lag is judged here."""

    instance: str = "monitor"
    resource_shortage_s: float = 60.0
    sync_timeout_window_s: float = 300.0
    slow_sync_ratio: float = 1.5
    gpu_temperature_c: float = 85.0
    gpu_temperature_for_s: float = 30.0
    heartbeat_lag_s: float = 2.0
    consumer_lag_messages: int = 1000
    consumer_lag_for_s: float = 30.0
    no_progress_s: float = 120.0
    dead_letter_window_s: float = 300.0
    slow_link_for_s: float = 30.0
    disk_floor_bytes: int = 1 << 30
    straggler_ratio: float = 1.4
    """STRAGGLER: a rank's own time a step over the median of the other ranks' (the fault manager's bound too)."""
    straggler_for_s: float = 20.0
    straggler_said_s: float = 60.0
    """STRAGGLER: the fault manager's verdict on a rank (``job.straggling``) holds the alert up this long, at once."""
    leader_proof_s: float = 4.0
    """NO_LEADER and LEADERSHIP_HIJACKED: a service's leadership unproven this long (an election takes about 3 s)."""
    """DISK_FULL: an output disk with less free space than this (the scheduler's disk filter floor)."""
    disk_full_window_s: float = 300.0
    """DISK_FULL: fires this long after a shard failed DISK_FULL on the node, whatever its disk says now."""
    node_alerts_grouped_over: int = 20
    """NODE_SUSPECT and HEARTBEAT_LAG: more nodes than this at once make one alert on ``ALL_NODES`` (how many, and
    the first by name), not one a node: that many at once is the bus, the control plane or the network more likely
    than the nodes, and thousands of alerts would be a storm that loads the very processes that lag."""

    @property
    def lag_subject(self) -> str:
        return f"monitor/{self.instance}"

    @property
    def disk_floor(self) -> str:
        return format_bytes(self.disk_floor_bytes)
