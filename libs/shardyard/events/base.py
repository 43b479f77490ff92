"""The base of every event on the bus: strict, frozen, identified, timestamped and versioned."""

from datetime import UTC, datetime
from typing import Annotated
from uuid import uuid4

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("timestamps must carry a time zone")
    return value.astimezone(UTC)


AwareDatetime = Annotated[datetime, AfterValidator(_aware)]


def new_event_id() -> str:
    return uuid4().hex


class Model(BaseModel):
    """A strict, immutable value inside an event."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Event(Model):
    """Common envelope fields. Subclasses add a ``type`` Literal, the discriminator of their topic's union."""

    event_id: str = Field(default_factory=new_event_id, min_length=1)
    occurred_at: AwareDatetime
    schema_version: int = 1
