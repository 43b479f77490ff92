"""Byte-level text dataset: every ``*.txt`` file under a directory, concatenated, sampled as random windows.

The sample stream is the gang's, not a rank's: each step draws the step's whole batch (``SHARDYARD_GLOBAL_BATCH``
windows, else world size x batch size) from one seeded generator, and each rank trains on its slice. With a global
batch kept, the windows of every step are the same whatever the world size, so an elastic gang re-formed at another
size at step ``k`` trains on exactly the data a gang of fixed size would have from step ``k + 1`` on."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from shardyard.errors import ShardyardError
from shardyard.training.config import rank_slice

Batch = tuple[torch.Tensor, torch.Tensor]


class DatasetError(ShardyardError, ValueError):
    """The dataset directory is missing, holds no text, or is too short for the requested windows."""


class ByteDataset:
    """A 1-D uint8 tensor of bytes; :meth:`batches` draws ``[batch, seq_len]`` windows from it."""

    def __init__(self, data: torch.Tensor, *, name: str = "<memory>") -> None:
        if data.dtype != torch.uint8 or data.dim() != 1:
            raise TypeError(f"expected a 1-D uint8 tensor, got {data.dtype} with shape {tuple(data.shape)}")
        if data.numel() == 0:
            raise DatasetError(f"dataset {name} is empty")
        self.data = data
        self.name = name

    @classmethod
    def from_dir(cls, directory: str | os.PathLike[str]) -> ByteDataset:
        """Concatenate every ``*.txt`` file under ``directory`` (recursive, sorted by relative path)."""
        root = Path(directory)
        if not root.is_dir():
            raise DatasetError(f"dataset directory {root} does not exist or is not a directory")
        files = sorted(p for p in root.rglob("*.txt") if p.is_file())
        if not files:
            raise DatasetError(f"dataset directory {root} contains no *.txt files")
        try:
            raw = b"".join(p.read_bytes() for p in files)
        except OSError as exc:
            raise DatasetError(f"cannot read dataset {root}: {exc}") from exc
        if not raw:
            raise DatasetError(f"dataset {root} is empty ({len(files)} *.txt files, 0 bytes)")
        return cls(torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy()), name=str(root))

    def __len__(self) -> int:
        return int(self.data.numel())

    def check_seq_len(self, seq_len: int) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if len(self) < seq_len + 1:
            raise DatasetError(f"dataset {self.name} has {len(self)} bytes; seq_len={seq_len} needs >= {seq_len + 1}")

    def batches(
        self,
        rank: int,
        world_size: int,
        batch_size: int,
        seq_len: int,
        seed: int,
        *,
        start_step: int = 0,
        global_batch: int | None = None,
    ) -> Iterator[Batch]:
        """Infinite stream of ``(inputs, targets)`` LongTensors ``[n, seq_len]``, targets shifted by one.

        Every rank seeds the same generator; each step it draws ``global_batch`` window starts (None:
        ``world_size * batch_size``) and rank ``r`` takes its slice of them (:func:`rank_slice`: as even as possible,
        ``[r * batch_size, (r + 1) * batch_size)`` when ``global_batch`` is ``world_size * batch_size``). The ranks'
        draws are therefore disjoint, and together they equal what one process drawing the combined batch would get.
        ``start_step`` skips that many steps' draws: a run resumed at step ``k`` sees exactly the batches an
        uninterrupted run would have seen from step ``k + 1`` on. The draws depend on the seed and ``global_batch``
        only, so a gang re-formed at another world size with the same ``global_batch`` goes on with the same windows.
        """
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if global_batch is not None and global_batch < world_size:
            raise ValueError(f"global_batch must be >= world_size={world_size}, got {global_batch}")
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {start_step}")
        self.check_seq_len(seq_len)  # raised here, not at the first next()
        draws = world_size * batch_size if global_batch is None else global_batch
        lo, hi = rank_slice(rank, world_size, draws)
        return self._stream(draws, lo, hi, seq_len, seed, start_step)

    def _stream(self, draws: int, lo: int, hi: int, seq_len: int, seed: int, start_step: int) -> Iterator[Batch]:
        """Each step ``draws`` window starts from the seeded generator; samples ``[lo, hi)`` of them are this rank's."""
        gen = torch.Generator().manual_seed(seed)
        n_starts = len(self) - seq_len  # a start s uses bytes [s, s + seq_len]
        offsets = torch.arange(seq_len + 1)
        for _ in range(start_step):  # the same draws as the steps being skipped, so the generator ends up alike
            torch.randint(0, n_starts, (draws,), generator=gen)
        while True:
            starts = torch.randint(0, n_starts, (draws,), generator=gen)[lo:hi]
            windows = self.data[starts.unsqueeze(1) + offsets].long()
            yield windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
