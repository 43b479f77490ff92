from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from shardyard.training.sync import GradSync, ParamSync, SyncStats


def _params() -> list[nn.Parameter]:
    torch.manual_seed(0)
    return [
        nn.Parameter(torch.randn(10, 10)),  # 400 B
        nn.Parameter(torch.randn(5, dtype=torch.float64)),  # 40 B
        nn.Parameter(torch.randn(30)),  # 120 B
        nn.Parameter(torch.randn(4, 4)),  # 64 B
    ]


@pytest.fixture
def single_rank_group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_world_size_one_is_a_noop(single_rank_group: None) -> None:
    params = _params()
    before = [p.detach().clone() for p in params]
    sync = ParamSync(params)
    assert sync.world_size() == 1
    stats = sync.allreduce_mean()
    assert stats.bytes == 0 and stats.buckets == 0
    assert 0.0 <= stats.ms < 50.0
    for p, b in zip(params, before, strict=True):
        assert torch.equal(p, b)
    assert sync.total_bytes == 400 + 40 + 120 + 64  # what a multi-rank sync would move


def test_without_a_process_group_it_is_a_noop_too() -> None:
    assert not dist.is_initialized()
    assert ParamSync(_params()).allreduce_mean().bytes == 0


def test_buckets_group_by_dtype_in_order_and_respect_the_size_cap() -> None:
    assert ParamSync(_params()).bucket_sizes == [400 + 120 + 64, 40]
    # 450 B cap: the first float32 bucket closes before the 120 B parameter; a parameter over the cap gets its own.
    assert ParamSync(_params(), bucket_bytes=450).bucket_sizes == [400, 120 + 64, 40]
    assert ParamSync(_params(), bucket_bytes=100).bucket_sizes == [400, 120, 64, 40]


def test_tied_parameters_are_reduced_once() -> None:
    p = nn.Parameter(torch.ones(8))
    assert ParamSync([p, p]).total_bytes == 32


def test_multi_rank_path_averages_and_copies_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulate a peer whose parameters are 3x ours: the SUM is 4x, the mean 2x."""
    params = _params()
    before = [p.detach().clone() for p in params]
    calls: list[int] = []

    def fake_all_reduce(tensor: torch.Tensor, op: object = None, group: object = None, async_op: bool = False) -> None:
        assert op == dist.ReduceOp.SUM
        calls.append(tensor.numel())
        tensor.mul_(4)

    monkeypatch.setattr(ParamSync, "world_size", lambda self: 2)
    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)  # sync.py calls it as dist.all_reduce
    sync = ParamSync(params, bucket_bytes=450)
    stats = sync.allreduce_mean()
    assert stats == SyncStats(ms=stats.ms, bytes=624, buckets=3)
    assert calls == [100 + 2, 46, 5]  # the first bucket carries the control slots (stop, slow) too
    assert not stats.stop
    for p, b in zip(params, before, strict=True):
        torch.testing.assert_close(p.detach(), 2 * b)
        assert p.grad is None and p.requires_grad


@pytest.mark.parametrize(
    ("ours", "peers", "agreed"),
    [
        pytest.param(False, 0.0, False, id="nobody"),
        pytest.param(True, 0.0, True, id="we-were-asked"),
        pytest.param(False, 1.0, True, id="a-peer-was-asked"),
        pytest.param(True, 2.0, True, id="everybody"),
    ],
)
def test_ranks_agree_to_stop_through_the_control_slot(
    monkeypatch: pytest.MonkeyPatch, ours: bool, peers: float, agreed: bool
) -> None:
    """The fake AllReduce adds the peers' flags to the stop slot (the next-to-last element of the first bucket)."""
    params = _params()
    before = [p.detach().clone() for p in params]
    first_call = [True]

    def fake_all_reduce(tensor: torch.Tensor, op: object = None, group: object = None, async_op: bool = False) -> None:
        tensor.mul_(2)  # a peer with identical parameters...
        if first_call[0]:
            tensor[-2] = tensor[-2] / 2 + peers  # ...and its own stop flags
            tensor[-1] = tensor[-1] / 2
            first_call[0] = False

    monkeypatch.setattr(ParamSync, "world_size", lambda self: 3)
    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    stats = ParamSync(params).allreduce_mean(stop=ours)

    assert stats.stop is agreed
    assert stats.slow_votes == 0 and not stats.slow
    for p, b in zip(params, before, strict=True):  # the slots are not parameters: the mean is untouched by them
        torch.testing.assert_close(p.detach(), 2 * b / 3)


@pytest.mark.parametrize(
    ("ours", "peers", "votes"),
    [
        pytest.param(False, 0.0, 0, id="nobody"),
        pytest.param(True, 0.0, 1, id="we-vote-slow"),
        pytest.param(False, 2.0, 2, id="two-peers-vote-slow"),
        pytest.param(True, 2.0, 3, id="everybody"),
    ],
)
def test_slow_votes_are_counted_in_the_same_collective(
    monkeypatch: pytest.MonkeyPatch, ours: bool, peers: float, votes: int
) -> None:
    """Every rank reads the same vote count from the last slot of the first bucket, beside an unchanged stop flag."""
    params = _params()
    before = [p.detach().clone() for p in params]
    calls: list[int] = []

    def fake_all_reduce(tensor: torch.Tensor, op: object = None, group: object = None, async_op: bool = False) -> None:
        tensor.mul_(2)
        if not calls:
            tensor[-2] = tensor[-2] / 2
            tensor[-1] = tensor[-1] / 2 + peers
        calls.append(tensor.numel())

    monkeypatch.setattr(ParamSync, "world_size", lambda self: 3)
    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    stats = ParamSync(params).allreduce_mean(slow=ours)

    assert (stats.slow_votes, stats.slow, stats.stop) == (votes, votes > 0, False)
    assert len(calls) == 2  # no extra collective for the vote
    for p, b in zip(params, before, strict=True):
        torch.testing.assert_close(p.detach(), 2 * b / 3)


def test_one_rank_stops_on_its_own_flag(single_rank_group: None) -> None:
    sync = ParamSync(_params())

    assert sync.allreduce_mean(stop=True).stop and not sync.allreduce_mean().stop
    assert sync.allreduce_mean(slow=True).slow_votes == 1 and not sync.allreduce_mean().slow


def test_without_parameters_the_flag_travels_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def fake_all_reduce(tensor: torch.Tensor, op: object = None, group: object = None, async_op: bool = False) -> None:
        calls.append(tensor.numel())
        tensor.add_(1)  # one peer asked to stop and voted slow

    monkeypatch.setattr(ParamSync, "world_size", lambda self: 2)
    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    stats = ParamSync([]).allreduce_mean()

    assert stats.stop and stats.slow_votes == 1 and stats.buckets == 1 and stats.bytes == 0 and calls == [2]


def test_the_parameters_live_in_the_buckets_and_are_reduced_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """No copy in or out: the only pass over memory besides the transfer is the division."""
    params = _params()
    before = [p.detach().clone() for p in params]
    reduced: list[int] = []
    monkeypatch.setattr(ParamSync, "world_size", lambda self: 2)
    monkeypatch.setattr(dist, "all_reduce", _peer_with(lambda tensor: reduced.append(tensor.data_ptr())))
    sync = ParamSync(params, bucket_bytes=450)
    homes = [p.data_ptr() for p in params]
    for p, b in zip(params, before, strict=True):
        assert torch.equal(p, b) and p.requires_grad and p.is_contiguous()

    sync.allreduce_mean()

    assert [p.data_ptr() for p in params] == homes
    assert reduced == [
        homes[0],
        homes[2],
        homes[1],
    ]  # each bucket starts with its first parameter: (400), (120, 64), (40)
    for p, b in zip(params, before, strict=True):
        torch.testing.assert_close(p.detach(), b / 2)  # a peer with zeros


def _peer_with(reduce: Callable[[torch.Tensor], object]) -> Callable[..., None]:
    def fake_all_reduce(tensor: torch.Tensor, op: object = None, group: object = None, async_op: bool = False) -> None:
        assert op == dist.ReduceOp.SUM
        reduce(tensor)

    return fake_all_reduce


def _model_with_grads(scale: float) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    for p in model.parameters():
        p.grad = torch.full_like(p, scale)
    return model


def test_gradient_sync_averages_the_gradients_and_leaves_the_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer whose gradients are all 3 while ours are 1: every gradient becomes 2, in one bucket with the slots."""
    model = _model_with_grads(1.0)
    weights = [p.detach().clone() for p in model.parameters()]
    calls: list[int] = []

    def peer(tensor: torch.Tensor) -> None:
        calls.append(tensor.numel())
        tensor[:-2].add_(3.0)  # the peer's gradients
        tensor[-2] += 1  # it asks to stop

    monkeypatch.setattr(GradSync, "world_size", lambda self: 2)
    monkeypatch.setattr(dist, "all_reduce", _peer_with(peer))
    sync = GradSync(list(model.parameters()))
    stats = sync.allreduce_mean()

    assert calls == [4 * 3 + 3 + 3 * 2 + 2 + 2]
    assert stats.stop and stats.bytes == 4 * (4 * 3 + 3 + 3 * 2 + 2) and stats.buckets == 1
    for p, w in zip(model.parameters(), weights, strict=True):
        assert torch.equal(p.detach(), w)
        assert p.grad is not None
        torch.testing.assert_close(p.grad, torch.full_like(p, 2.0))


def test_a_parameter_without_a_gradient_gets_the_averaged_one(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model_with_grads(1.0)
    unused = model[1].bias
    unused.grad = None

    monkeypatch.setattr(GradSync, "world_size", lambda self: 2)
    monkeypatch.setattr(dist, "all_reduce", _peer_with(lambda tensor: tensor[:-2].add_(4.0)))  # the peer's: 4
    GradSync(list(model.parameters())).allreduce_mean()

    assert unused.grad is not None
    torch.testing.assert_close(unused.grad, torch.full_like(unused, 2.0))  # (0 + 4) / 2
    torch.testing.assert_close(model[0].weight.grad, torch.full_like(model[0].weight, 2.5))  # (1 + 4) / 2


def test_one_rank_gradient_sync_is_a_noop(single_rank_group: None) -> None:
    model = _model_with_grads(1.5)
    stats = GradSync(list(model.parameters())).allreduce_mean(stop=True)
    assert stats.bytes == 0 and stats.stop
    assert all(p.grad is not None and torch.equal(p.grad, torch.full_like(p, 1.5)) for p in model.parameters())


def _gloo_rank(rank: int, store_path: str, results: Any) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    try:
        model = _model_with_grads(float(rank + 1))  # gradients 1 and 2
        grads = GradSync(list(model.parameters()), bucket_bytes=40).allreduce_mean(slow=rank == 1)
        params = [nn.Parameter(torch.full((5,), float(10 * (rank + 1))))]  # 10 and 20
        averaged = ParamSync(params).allreduce_mean(stop=rank == 0)
        results.put(
            (
                rank,
                [p.grad.tolist() for p in model.parameters() if p.grad is not None],
                params[0].tolist(),
                (grads.slow_votes, grads.stop, averaged.stop, grads.buckets),
            )
        )
    finally:
        dist.destroy_process_group()


def test_two_real_gloo_ranks_agree(tmp_path: Path) -> None:
    context = mp.get_context("spawn")
    results = context.Queue()
    procs = [context.Process(target=_gloo_rank, args=(rank, str(tmp_path / "store"), results)) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    got = sorted(results.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    assert [proc.exitcode for proc in procs] == [0, 0]
    for _, grads, params, flags in got:
        assert all(value == 1.5 for grad in grads for value in _flat(grad))
        assert params == [15.0] * 5
        assert flags[:3] == (1, False, True) and flags[3] > 1  # several buckets; the votes in the first
    assert got[0][1:] == got[1][1:]


def _flat(values: Any) -> list[float]:
    return [v for item in values for v in _flat(item)] if isinstance(values, list) else [values]
