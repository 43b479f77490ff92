"""A plain PyTorch DistributedDataParallel script: nothing in it knows about Shardyard.

It learns a fixed random linear map plus a nonlinearity from synthetic data (deterministic for a seed; each rank draws
its own batches), and prints ``[rank R] step N loss X`` lines. Run it with torchrun, or as a Shardyard job
(``examples/ddp_job.json``), which gives it the same environment::

    torchrun --nproc-per-node 2 examples/ddp_train.py --steps 200
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES = 16


def batch(generator: torch.Generator, target: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(size, FEATURES, generator=generator)
    y = torch.tanh(x @ target) + 0.01 * torch.randn(size, 1, generator=generator)
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the env
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if cuda:
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    target = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(1234))
    data = torch.Generator().manual_seed(args.seed * 1_000_003 + rank)  # each rank its own stream of batches
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.MSELoss()

    for step in range(1, args.steps + 1):
        x, y = batch(data, target, args.batch_size)
        loss = loss_fn(ddp(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients over the ranks here
        optimizer.step()
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            print(f"[rank {rank}] step {step} loss {loss.item():.6f}", flush=True)

    dist.barrier()
    if rank == 0:
        print(f"done: {args.steps} steps on {world_size} ranks", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
