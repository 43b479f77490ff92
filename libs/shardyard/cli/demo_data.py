"""The example job's inputs for a local cluster (``shardyard up --demo-data``, ``shardyard demo``): its pretrained
model and dataset, made under the folder the agents mount at ``/data``, where the example names them."""

from collections.abc import Callable
from pathlib import Path

MOUNT = "/data"
"""The job path prefix ``up``'s agents mount the data root at (``--mounts /data=DATA_ROOT``)."""
MODEL = "models/gpt2_pretrained"
DATASET = "datasets/wikitext"
EXAMPLE_PATHS = (f"{MOUNT}/{MODEL}", f"{MOUNT}/{DATASET}")
"""The job paths of the example's pretrained model and dataset (``examples/fine_tune_gpt2.json``)."""


def data_root(root: Path, *, with_demo: bool, say: Callable[[str], None]) -> None:
    """Make the folder the agents mount at ``/data``; ``with_demo``, the example's data in it (:func:`provide`)."""
    root.mkdir(parents=True, exist_ok=True)
    if with_demo:
        provide(root, say)


def provide(data_root: Path, say: Callable[[str], None]) -> None:
    """Create the example's model and dataset under ``data_root`` unless they are there (then they are kept), and say
    where. Loads torch: only for the commands that ask for the data."""
    from shardyard.training.artifacts import DEMO_TEXT_FILE, create_demo_artifacts

    there = (data_root / MODEL).is_dir() and (data_root / DATASET / DEMO_TEXT_FILE).is_file()
    made = create_demo_artifacts(data_root)
    what = "kept" if there else "created"
    say(
        f"demo data {what}: the example's model {MOUNT}/{MODEL} in {made.model_dir}, "
        f"its dataset {MOUNT}/{DATASET} in {made.dataset_dir}"
    )
