from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from shardyard.training.data import ByteDataset, DatasetError


def _random_dataset(n: int = 50_000) -> ByteDataset:
    raw = random.Random(0).randbytes(n)  # random bytes: a 16-byte window identifies its start
    return ByteDataset(torch.tensor(list(raw), dtype=torch.uint8))


def _windows(batch: tuple[torch.Tensor, torch.Tensor]) -> list[tuple[int, ...]]:
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
