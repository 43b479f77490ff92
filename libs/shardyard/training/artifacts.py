"""Demo inputs for local runs and tests: a freshly initialised small GPT-2 with a byte-level vocabulary (a Hugging
Face checkpoint directory, made here: nothing is downloaded) and a generated English-like corpus."""

from __future__ import annotations

import os
import random
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from shardyard.training.model import (
    CheckpointError,
    TinyGPT,
    TinyGPTConfig,
    is_legacy_layout,
    load_pretrained,
    save_pretrained,
)

DEMO_MODEL = Path("models/gpt2_pretrained")
DEMO_DATASET = Path("datasets/wikitext")
DEMO_TEXT_FILE = "train.txt"
DEFAULT_TEXT_BYTES = 300_000

_SUBJECTS = [
    "the river",
    "a small town",
    "the old bridge",
    "the council",
    "the railway",
    "a local school",
    "the museum",
    "the northern road",
    "the harbour",
    "the first church",
    "the castle",
    "the market",
]
_VERBS = [
    "was built in",
    "was rebuilt in",
    "was opened in",
    "was closed in",
    "was extended in",
    "was named in",
    "was restored in",
]
_ADJECTIVES = ["large", "quiet", "famous", "narrow", "ancient", "busy", "modern", "wooden", "stone", "green"]
_NOUNS = ["village", "valley", "station", "tower", "garden", "library", "farm", "mill", "square", "hall"]
_PLACES = ["near the coast", "in the north", "beside the lake", "on the hill", "along the river", "in the city"]
_LINKS = ["Later", "In the same year", "After the war", "During the winter", "By the end of the century"]
_TITLES = ["History", "Geography", "Architecture", "Economy", "Transport", "Culture", "Education"]


@dataclass(frozen=True)
class DemoArtifacts:
    model_dir: Path
    dataset_dir: Path


def create_demo_artifacts(
    data_root: Path,
    *,
    seed: int = 0,
    model_config: TinyGPTConfig | None = None,
    text_bytes: int = DEFAULT_TEXT_BYTES,
) -> DemoArtifacts:
    """Create (idempotently) ``data_root/models/gpt2_pretrained`` and ``data_root/datasets/wikitext/train.txt``.

    The model is a seeded, freshly initialised GPT-2 (``config.json`` + ``model.safetensors``, as transformers saves
    a GPT2LMHeadModel) of 256 byte tokens, 128 positions, 2 layers of width 64 and 4 heads, unless ``model_config``
    says otherwise. An existing model directory is kept if it loads, has that config and is in the GPT-2 layout (one
    written by an earlier version is replaced). An existing text file is kept as it is.
    """
    data_root = Path(data_root)
    model_dir = data_root / DEMO_MODEL
    dataset_dir = data_root / DEMO_DATASET
    config = TinyGPTConfig() if model_config is None else model_config
    if not _loads(model_dir, config):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = TinyGPT(config)
        save_pretrained(model, model_dir)
    text_path = dataset_dir / DEMO_TEXT_FILE
    if not text_path.is_file():
        dataset_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(text_path, generate_text(seed, text_bytes).encode("ascii"))
    return DemoArtifacts(model_dir=model_dir, dataset_dir=dataset_dir)


def generate_text(seed: int, n_bytes: int) -> str:
    """Deterministic wikitext-like prose from small word lists: ``= Title =`` headings and templated sentences."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < n_bytes:
        section = f" = {rng.choice(_TITLES)} of the {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} = \n\n"
        sentences = [_sentence(rng) for _ in range(rng.randint(3, 8))]
        paragraph = section + " ".join(sentences) + "\n\n"
        parts.append(paragraph)
        size += len(paragraph)
    return "".join(parts)[:n_bytes]


def _sentence(rng: random.Random) -> str:
    year = rng.randint(1700, 1999)
    subject = rng.choice(_SUBJECTS)
    kind = rng.randrange(3)
    if kind == 0:
        text = f"{subject} {rng.choice(_VERBS)} {year}"
    elif kind == 1:
        text = f"{rng.choice(_LINKS)} , {subject} became {_a(rng.choice(_ADJECTIVES))} {rng.choice(_NOUNS)}"
    else:
        text = f"{subject} is {_a(rng.choice(_ADJECTIVES))} {rng.choice(_NOUNS)} {rng.choice(_PLACES)}"
    return text[0].upper() + text[1:] + " ."


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _loads(model_dir: Path, config: TinyGPTConfig) -> bool:
    try:
        return load_pretrained(model_dir).config == config and not is_legacy_layout(model_dir)
    except CheckpointError:
        return False


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
