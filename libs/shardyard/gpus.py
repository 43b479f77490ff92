"""The GPU catalogue: known models and the throughput figure (TFLOPS) a job's ``min_flops`` is compared with.

The defaults reproduce the figures of the product brief (A100 35, V100 15); the others are vendor FP32 figures.
Agents may override a node's figure with a measured one; the scheduler then uses the node's own figure.
"""

from collections.abc import Mapping
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


def canonical_model(name: str) -> str:
    """Normalise a GPU model name as users and NVML write it ("NVIDIA A100-SXM4-80GB" -> "A100")."""
    upper = name.upper().replace("NVIDIA", "").replace("TESLA", "").replace("GEFORCE", "").strip()
    upper = upper.replace(" ", "").replace("RTX-", "RTX")
    for known in sorted(DEFAULT_TFLOPS, key=len, reverse=True):
        if upper.startswith(known):
            return known
    return upper.split("-")[0]


def match_score(node_tflops: float, required_tflops: float) -> float:
    """The seed's match score: ``min(1, node / required)`` (A100 35 for a 35-TFLOPS job -> 1.0, V100 15 -> ~0.43)."""
    if required_tflops <= 0:
        return 1.0
    return min(1.0, node_tflops / required_tflops)
