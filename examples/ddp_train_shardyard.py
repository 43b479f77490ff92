"""examples/ddp_train.py with the optional ``shardyard.train`` client: the same DDP training, plus progress in the
monitor, a checkpoint at every parameter sync that recovery and preemption resume from, and a clean stop when the
scheduler preempts the job. Outside Shardyard the client does nothing, so this still runs under torchrun::

    torchrun --nproc-per-node 2 examples/ddp_train_shardyard.py --steps 200
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from shardyard import train

FEATURES = 16


def batch(generator: torch.Generator, target: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(size, FEATURES, generator=generator)
    y = torch.tanh(x @ target) + 0.01 * torch.randn(size, 1, generator=generator)
    return x, y


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(args.seed)
    target = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(1234))
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = 0
    restored = train.restore(map_location=str(device))  # after a preemption or a failure: where the gang stopped
    if restored is not None:
        state, start = restored
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        print(f"[rank {rank}] resumed at step {start}", flush=True)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    data = torch.Generator().manual_seed(args.seed * 1_000_003 + rank * 7919 + start)  # fresh batches after a resume
    loss_fn = nn.MSELoss()

    for step in range(start + 1, args.steps + 1):
        x, y = batch(data, target, args.batch_size)
        loss = loss_fn(ddp(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            print(f"[rank {rank}] step {step} loss {loss.item():.6f}", flush=True)
        if train.sync_due(step) or step == args.steps:
            # DDP keeps the weights equal already: this sync is where the ranks agree whether to stop.
            stats = train.average_parameters(model)
            train.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step)
            if stats.stop and step < args.steps:
                print(f"[rank {rank}] preempted at step {step}", flush=True)
                dist.barrier()  # nobody reports the stop before rank 0's checkpoint is in place
                dist.destroy_process_group()
                return train.preempted(step)
        train.report(step, loss.item(), samples=args.batch_size)  # the monitor's step, loss, samples/s and syncs

    dist.barrier()
    if rank == 0:
        print(f"done: {args.steps} steps on {world_size} ranks", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
