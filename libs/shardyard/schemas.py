"""JSON Schemas of every event, generated from the pydantic models into ``schemas/``.

``python -m shardyard.schemas schemas/`` rewrites them; a test fails when the committed files drift from the models.
"""

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from shardyard.bus.topics import CATALOGUE
from shardyard.events import JobSubmission


def generate() -> dict[str, dict[str, Any]]:
    """File name -> schema: the submission users write, and the events of each topic."""
    schemas: dict[str, dict[str, Any]] = {"job-submission.json": JobSubmission.model_json_schema()}
    for topic in CATALOGUE:
        if topic.payload is None:
            continue
        schema = TypeAdapter(topic.payload).json_schema()
        schema["title"] = f"Events of {topic.name}"
        schema["description"] = f"Keyed by {topic.key}; {topic.partitions} partitions" + (
            ", compacted" if topic.compacted else ""
        )
        schemas[f"{topic.name}.json"] = schema
    return schemas


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in generate().items():
        path = folder / name
        path.write_text(render(schema))
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1] if len(sys.argv) > 1 else "schemas")):
        print(path)
