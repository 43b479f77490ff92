"""Service presence and leadership: each process announces itself when its subscribers are running; a replica that
wins its service's election claims a term and announces it."""

from typing import Annotated, Literal

from pydantic import Field

from shardyard.events.base import Event


class ServiceReady(Event):
    type: Literal["service.ready"] = "service.ready"
    service: str
    instance: str
    pid: int
    host: str


class LeadershipClaimed(Event):
    """Written by the replica that now holds its service's election partition. The claim's offset in the
    one-partition leadership topic, plus one, is the leader's term: unique, and higher than every earlier claim's."""

    type: Literal["leadership.claimed"] = "leadership.claimed"
    service: str
    instance: str


class LeaderElected(Event):
    """A replica leads its service from now on, under ``term``."""

    type: Literal["service.leader"] = "service.leader"
    service: str
    instance: str
    term: int = Field(ge=1)


ServiceEvent = Annotated[ServiceReady | LeaderElected, Field(discriminator="type")]
"""What the services topic carries."""
