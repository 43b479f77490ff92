"""An elastic gang's global batch sliced unevenly over its ranks still makes the update of the whole batch: each
rank's loss weighted by its slice's share (``RunConfig.loss_weight``), the averaged gradient is the gradient of the
mean loss over the global batch, as gradient averaging (``shardyard.training.sync.GradSync``) takes it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shardyard.training.config import RunConfig

ENV = {
    "LOCAL_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "SHARDYARD_MODEL_DIR": "/m",
    "SHARDYARD_DATASET_DIR": "/d",
    "SHARDYARD_OUTPUT_DIR": "/o",
    "SHARDYARD_SYNC_INTERVAL": "1",
    "SHARDYARD_MAX_STEPS": "10",
    "SHARDYARD_BATCH_SIZE": "3",
    "SHARDYARD_SEQ_LEN": "8",
    "SHARDYARD_LR": "0.001",
    "SHARDYARD_SEED": "0",
}


def _gradient(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, weight: float) -> list[torch.Tensor]:
    model.zero_grad()
    (F.cross_entropy(model(inputs), targets) * weight).backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize(("world", "global_batch"), [(4, 6), (3, 7), (2, 6), (5, 5)])
def test_the_averaged_gradient_of_weighted_slices_is_the_whole_batchs(world: int, global_batch: int) -> None:
    torch.manual_seed(0)
    model = nn.Linear(5, 4)
    inputs, targets = torch.randn(global_batch, 5), torch.randint(0, 4, (global_batch,))
    whole = _gradient(model, inputs, targets, 1.0)

    summed = [torch.zeros_like(g) for g in whole]
    for rank in range(world):
        env = {**ENV, "RANK": str(rank), "WORLD_SIZE": str(world), "SHARDYARD_GLOBAL_BATCH": str(global_batch)}
        cfg = RunConfig.from_env(env)
        lo, hi = cfg.batch_slice
        for total, g in zip(summed, _gradient(model, inputs[lo:hi], targets[lo:hi], cfg.loss_weight), strict=True):
            total += g
    averaged = [total / world for total in summed]  # what the gradient AllReduce's mean gives every rank

    for got, expected in zip(averaged, whole, strict=True):
        torch.testing.assert_close(got, expected)
