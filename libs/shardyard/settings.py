"""Settings, loaded once in each ``__main__`` from the command line and ``SHARDYARD_*`` environment variables and
passed down; nothing below ``__main__`` reads the environment."""

import argparse
import os
import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from shardyard.bus.address import BOOTSTRAP_ENV
from shardyard.errors import ConfigError
from shardyard.gpus import catalogue_with

if TYPE_CHECKING:
    from shardyard.bus.leadership import ElectionTimings


def _gpu_figures(value: list[str]) -> list[str]:
    catalogue_with(value)  # raises ValueError naming the bad entry
    return value


GpuFigures = Annotated[list[str], AfterValidator(_gpu_figures)]
"""GPU catalogue overrides as ``MODEL=TFLOPS`` entries (``--gpu-tflops A100=19.5``, repeatable)."""


def default_instance() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class ServiceSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str = Field(default="127.0.0.1:9092", description="Kafka bootstrap servers (host:port[,host:port])")
    instance: str = Field(default_factory=default_instance, min_length=1, description="this replica's name")
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")
    metrics_port: int = Field(
        default=0, ge=0, lt=65536, description="serve this process's Prometheus metrics on this port (0: off)"
    )
    metrics_host: str = Field(default="127.0.0.1", description="address the metrics port binds (0.0.0.0: every one)")


S = TypeVar("S", bound=ServiceSettings)


def _env_name(field: str) -> str:
    return BOOTSTRAP_ENV if field == "bootstrap" else f"SHARDYARD_{field.upper()}"


def load_settings(cls: type[S], argv: Sequence[str], env: Mapping[str, str], *, prog: str) -> S:
    """Fields come from ``--field-name VALUE`` (repeatable for list fields), else ``SHARDYARD_FIELD_NAME``."""
    parser = argparse.ArgumentParser(prog=prog, description=cls.__doc__)
    for name, info in cls.model_fields.items():
        is_list = getattr(info.annotation, "__origin__", None) in (list, tuple)
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            action="append" if is_list else "store",
            help=f"{info.description or name} (env {_env_name(name)})",
        )
    args = vars(parser.parse_args(list(argv)))
    values: dict[str, Any] = {}
    for name, info in cls.model_fields.items():
        if args.get(name) is not None:
            values[name] = args[name]
        elif _env_name(name) in env:
            raw = env[_env_name(name)]
            is_list = getattr(info.annotation, "__origin__", None) in (list, tuple)
            values[name] = [part for part in raw.split(",") if part] if is_list else raw
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{prog}: invalid settings: {problems}") from exc


class ReplicatedSettings(ServiceSettings):
    """A service that runs as several replicas: with one leader, elected through Kafka (see ``bus.leadership``), or
    (the resource pool) splitting the work through a consumer group with the same timings."""

    election_session_timeout_ms: int = Field(default=2000, ge=100, description="a silent replica is dropped after")
    election_heartbeat_interval_ms: int = Field(default=250, ge=10, description="group heartbeats every")
    election_rebalance_timeout_ms: int = Field(default=1000, ge=100, description="how long a re-election may take")
    election_lease_s: float = Field(
        default=0.75, gt=0, description="a leader acts this long after proving it still leads"
    )

    def election_timings(self) -> "ElectionTimings":
        from shardyard.bus.leadership import ElectionTimings

        try:
            return ElectionTimings(
                session_timeout_ms=self.election_session_timeout_ms,
                heartbeat_interval_ms=self.election_heartbeat_interval_ms,
                rebalance_timeout_ms=self.election_rebalance_timeout_ms,
                lease_s=self.election_lease_s,
                renew_interval_s=min(0.2, self.election_lease_s / 3),
            )
        except ValueError as exc:
            raise ConfigError(f"invalid election settings: {exc}") from exc
