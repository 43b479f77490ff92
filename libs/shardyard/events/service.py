"""Service presence: each process announces itself when its subscribers are running."""

from typing import Literal

from shardyard.events.base import Event


class ServiceReady(Event):
    type: Literal["service.ready"] = "service.ready"
    service: str
    instance: str
    pid: int
    host: str
