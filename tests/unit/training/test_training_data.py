from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from shardyard.training.config import rank_slice
from shardyard.training.data import Batch, ByteDataset, DatasetError

Window = tuple[int, ...]


def _random_dataset(n: int = 50_000) -> ByteDataset:
    raw = random.Random(0).randbytes(n)  # random bytes: a 16-byte window identifies its start
    return ByteDataset(torch.tensor(list(raw), dtype=torch.uint8))


def _windows(batch: tuple[torch.Tensor, torch.Tensor]) -> list[Window]:
    inputs, targets = batch
    return [(*row.tolist(), int(t[-1])) for row, t in zip(inputs, targets, strict=True)]


def test_batches_have_shifted_targets() -> None:
    ds = _random_dataset()
    inputs, targets = next(ds.batches(rank=0, world_size=1, batch_size=4, seq_len=16, seed=3))
    assert inputs.shape == targets.shape == (4, 16)
    assert inputs.dtype == targets.dtype == torch.long
    assert torch.equal(inputs[:, 1:], targets[:, :-1])


def test_ranks_draw_disjoint_windows_whose_union_is_the_single_process_draw() -> None:
    ds = _random_dataset()
    world, batch, seq, seed = 3, 4, 15, 11
    streams = [ds.batches(rank, world, batch, seq, seed) for rank in range(world)]
    single = ds.batches(0, 1, world * batch, seq, seed)
    for _ in range(5):  # several steps: the ranks stay in lockstep with the combined draw
        per_rank = [_windows(next(s)) for s in streams]
        combined = _windows(next(single))
        for a in range(world):
            for b in range(a + 1, world):
                assert not set(per_rank[a]) & set(per_rank[b])
        assert [w for rank_windows in per_rank for w in rank_windows] == combined


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    ds = _random_dataset()
    a, b, c = (next(ds.batches(0, 2, 4, 8, seed)) for seed in (5, 5, 6))
    assert torch.equal(a[0], b[0])
    assert not torch.equal(a[0], c[0])


def test_from_dir_reads_every_txt_file_recursively_in_sorted_order(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "2.txt").write_bytes(b"BB")
    (tmp_path / "a.txt").write_bytes(b"AA")
    (tmp_path / "c.md").write_bytes(b"not text data")
    ds = ByteDataset.from_dir(tmp_path)
    assert bytes(ds.data.tolist()) == b"AABB"
    assert len(ds) == 4


def test_window_can_span_the_whole_dataset(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_bytes(b"abcde")
    inputs, targets = next(ByteDataset.from_dir(tmp_path).batches(0, 1, 2, 4, 0))
    assert bytes(inputs[0].tolist()) == b"abcd" and bytes(targets[0].tolist()) == b"bcde"


def test_missing_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        ByteDataset.from_dir(tmp_path / "nope")


def test_directory_without_txt_files_raises(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match=r"no \*\.txt files"):
        ByteDataset.from_dir(tmp_path)


def test_empty_txt_files_raise(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(DatasetError, match="empty"):
        ByteDataset.from_dir(tmp_path)


def test_dataset_shorter_than_a_window_raises_when_batches_is_called(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_bytes(b"x" * 64)
    ds = ByteDataset.from_dir(tmp_path)
    with pytest.raises(DatasetError, match="seq_len=64 needs >= 65"):
        ds.batches(0, 1, 1, 64, 0)  # raised eagerly, not at the first next()


@pytest.mark.parametrize(("rank", "world"), [(2, 2), (-1, 2), (0, 0)])
def test_bad_rank_raises(rank: int, world: int) -> None:
    with pytest.raises(ValueError, match="rank"):
        _random_dataset().batches(rank, world, 1, 4, 0)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_stream_started_at_step_k_continues_the_uninterrupted_one(rank: int) -> None:
    ds = _random_dataset()
    uninterrupted = ds.batches(rank, 2, 4, 16, seed=5)
    for _ in range(7):
        next(uninterrupted)
    resumed = ds.batches(rank, 2, 4, 16, seed=5, start_step=7)
    for _ in range(3):
        expected, got = next(uninterrupted), next(resumed)
        assert torch.equal(expected[0], got[0]) and torch.equal(expected[1], got[1])


def test_negative_start_step_is_refused() -> None:
    with pytest.raises(ValueError, match="start_step"):
        _random_dataset().batches(0, 1, 4, 16, seed=0, start_step=-1)


def _old_stream(ds: ByteDataset, rank: int, world: int, batch: int, seq: int, seed: int, start: int) -> Iterator[Batch]:
    """The stream as it was before the global batch (a copy of the old ``ByteDataset._stream``): rigid jobs must see
    it bit for bit."""
    gen = torch.Generator().manual_seed(seed)
    n_starts = len(ds) - seq
    offsets = torch.arange(seq + 1)
    for _ in range(start):
        torch.randint(0, n_starts, (world * batch,), generator=gen)
    while True:
        starts = torch.randint(0, n_starts, (world * batch,), generator=gen)[rank * batch : (rank + 1) * batch]
        windows = ds.data[starts.unsqueeze(1) + offsets].long()
        yield windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


@pytest.mark.parametrize(("world", "batch", "start"), [(1, 4, 0), (2, 4, 0), (3, 5, 7), (4, 1, 2)])
@pytest.mark.parametrize("global_batch", ["unset", "world x batch"])
def test_a_rigid_gangs_stream_is_bit_for_bit_the_one_before_the_global_batch(
    world: int, batch: int, start: int, global_batch: str
) -> None:
    ds = _random_dataset()
    for rank in range(world):
        given = None if global_batch == "unset" else world * batch
        new = ds.batches(rank, world, batch, 16, seed=9, start_step=start, global_batch=given)
        old = _old_stream(ds, rank, world, batch, 16, 9, start)
        for _ in range(4):
            (inputs, targets), (old_inputs, old_targets) = next(new), next(old)
            assert torch.equal(inputs, old_inputs) and torch.equal(targets, old_targets)


def _step_windows(
    ds: ByteDataset, world: int, global_batch: int, *, start: int = 0, steps: int = 3
) -> list[list[Window]]:
    """For each step, the windows of ranks 0, 1, ... of a gang of ``world`` in rank order: the step's batch."""
    streams = [ds.batches(r, world, 1, 16, seed=4, start_step=start, global_batch=global_batch) for r in range(world)]
    return [[w for s in streams for w in _windows(next(s))] for _ in range(steps)]


def test_the_steps_windows_are_the_same_at_every_world_size_for_one_global_batch() -> None:
    ds = _random_dataset()
    at_2, at_4, at_8 = (_step_windows(ds, world, 8) for world in (2, 4, 8))
    single = _step_windows(ds, 1, 8)
    assert at_2 == at_4 == at_8 == single
    assert all(len(set(step)) == 8 for step in at_4)  # disjoint slices: every window once


def test_a_gang_resumed_at_another_world_size_goes_on_with_the_same_windows() -> None:
    ds = _random_dataset()
    fixed = _step_windows(ds, 4, 8, steps=9)
    grown = _step_windows(ds, 2, 8, steps=5) + _step_windows(ds, 4, 8, start=5, steps=4)  # 2 -> 4 after step 5
    shrunk = _step_windows(ds, 4, 8, steps=3) + _step_windows(ds, 2, 8, start=3, steps=6)  # 4 -> 2 after step 3
    assert grown == fixed and shrunk == fixed


def test_uneven_slices_cover_the_global_batch_exactly_once() -> None:
    ds = _random_dataset()
    streams = [ds.batches(r, 4, 1, 16, seed=2, global_batch=6) for r in range(4)]
    single = ds.batches(0, 1, 6, 16, seed=2)
    for _ in range(3):
        per_rank = [_windows(next(s)) for s in streams]
        assert [len(w) for w in per_rank] == [2, 2, 1, 1]  # the first 6 % 4 ranks take one more
        assert [w for windows in per_rank for w in windows] == _windows(next(single))


@pytest.mark.parametrize(
    ("world", "global_batch", "slices"),
    [(4, 6, [(0, 2), (2, 4), (4, 5), (5, 6)]), (2, 8, [(0, 4), (4, 8)]), (3, 3, [(0, 1), (1, 2), (2, 3)])],
)
def test_rank_slices_are_consecutive_and_as_even_as_possible(
    world: int, global_batch: int, slices: list[tuple[int, int]]
) -> None:
    assert [rank_slice(r, world, global_batch) for r in range(world)] == slices


def test_a_global_batch_below_the_world_size_is_refused() -> None:
    with pytest.raises(ValueError, match="global_batch"):
        _random_dataset().batches(0, 4, 1, 16, seed=0, global_batch=3)
