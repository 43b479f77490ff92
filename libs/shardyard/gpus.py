"""The GPU catalogue: known models and the throughput figure (TFLOPS) a job's ``min_flops`` is compared with.

The defaults reproduce the figures of the product brief (A100 35, V100 15); the others are vendor FP32 figures.
Agents may override a node's figure with a measured one; the scheduler then uses the node's own figure.
"""

import math
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

DEFAULT_TFLOPS: Mapping[str, float] = MappingProxyType(
    {
        "A100": 35.0,
        "V100": 15.0,
        "H100": 67.0,
        "H200": 67.0,
        "A10": 31.2,
        "L4": 30.3,
        "L40S": 91.6,
        "T4": 8.1,
        "RTX4090": 82.6,
    }
)


_VENDOR_WORDS = re.compile(r"\b(NVIDIA|TESLA|GEFORCE|QUADRO)\b")
_SERIES = ("RTX", "GTX", "TITAN")


def canonical_model(name: str) -> str:
    """Normalise a GPU model name as users and NVML write it: "NVIDIA A100-SXM4-80GB" -> "A100",
    "H100 80GB HBM3" -> "H100", "GeForce RTX 4090" -> "RTX4090". The model is the first token after the vendor
    words, matched whole ("L40" is not "L4")."""
    tokens = [t for t in re.split(r"[\s_-]+", _VENDOR_WORDS.sub(" ", name.upper())) if t]
    if not tokens:
        return name.strip().upper()
    if tokens[0] in _SERIES and len(tokens) > 1:
        return tokens[0] + tokens[1]
    return tokens[0]


def catalogue_with(overrides: Sequence[str]) -> Mapping[str, float]:
    """The default catalogue plus ``MODEL=TFLOPS`` overrides (``["A100=19.5", "MI300X=163"]``).

    Raises ValueError naming the bad entry.
    """
    merged = dict(DEFAULT_TFLOPS)
    for item in overrides:
        model, sep, figure = item.partition("=")
        try:
            tflops = float(figure)
        except ValueError:
            tflops = float("nan")
        if not sep or not model.strip() or not math.isfinite(tflops) or tflops <= 0:
            raise ValueError(f"cannot read GPU figure {item!r}; write MODEL=TFLOPS, e.g. A100=35")
        merged[canonical_model(model)] = tflops
    return MappingProxyType(merged)


def match_score(node_tflops: float, required_tflops: float) -> float:
    """The seed's match score: ``min(1, node / required)`` (A100 35 for a 35-TFLOPS job -> 1.0, V100 15 -> ~0.43)."""
    if required_tflops <= 0:
        return 1.0
    return min(1.0, node_tflops / required_tflops)
