"""The casts behind the conversion (``lit_amp.amp.casting``): O1's white-listed torch functions,
the cached low-precision copies of the parameters and the pooled float32 gradient buffers.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_amp.amp import casting as mp
from lit_amp.amp.casting import invalidate_cast_cache
from lit_amp.amp.convert import (
    auto_mixed_precision,
    custom_mixed_precision,
    remove_mixed_precision,
)
from lit_amp.amp.lists import get_white_list

F32, BF16 = torch.float32, torch.bfloat16


def test_o1_intercepts_the_white_listed_functions():
    seen = {}

    class Ops(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))
            self.k = nn.Parameter(torch.randn(2, 1, 3))

        def forward(self, x):
            w = self.w
            r = {
                "matmul": torch.matmul(x, w), "@": x @ w, "Tensor.matmul": x.matmul(w),
                "mm": torch.mm(x, w), "linear": F.linear(x, w), "bmm": torch.bmm(x[None], w[None]),
                "outer": torch.outer(x[0], x[1]), "conv1d": F.conv1d(x[:, None], self.k),
                "F.relu": F.relu(x - 0.3), "torch.relu": torch.relu(x), "Tensor.relu": x.relu(),
                "prelu": F.prelu(x, torch.tensor([0.25])),
                "einsum": torch.einsum("ij,jk->ik", x, w), "softmax": x.softmax(-1),
            }
            seen.update(r)
            return sum(v.float().sum() for v in r.values())

    # MindSpore's O1 mechanism, which a custom white list keeps (the built-in O1 runs on
    # torch.autocast: tests/amp/test_o1_autocast.py)
    net = custom_mixed_precision(Ops(), white_list=get_white_list(), dtype=BF16)
    x = torch.randn(3, 4) * 1.7
    net(x).backward()
    q = x.to(BF16).float()
    wq = net.w.detach().to(BF16).float()
    for name, v in seen.items():
        assert v.dtype == F32, name  # the result is cast back to fp32
    # results equal the computation on bf16-rounded inputs, rounded to bf16
    assert torch.equal(seen["matmul"], (q @ wq).to(BF16).float())
    assert torch.equal(seen["F.relu"], F.relu((x - 0.3).to(BF16)).float())  # cast, then relu
    # not white-listed: exact fp32 computation
    assert torch.equal(seen["einsum"], torch.einsum("ij,jk->ik", x, net.w.detach()))
    assert torch.equal(seen["softmax"], x.softmax(-1))
    assert net.w.grad.dtype == F32 and net.k.grad.dtype == F32


def test_o1_leaves_in_place_relu_alone():
    class M(nn.Module):
        def forward(self, x):
            y = x * 1.0
            F.relu(y, inplace=True)
            return y

    net = custom_mixed_precision(M(), white_list=get_white_list(), dtype=BF16)
    x = torch.randn(5)
    assert torch.equal(net(x), x.clamp(min=0))


def test_cached_casts_follow_optimizer_steps_including_fused(monkeypatch):
    monkeypatch.setattr(mp, "CACHE_MIN_NUMEL", 0)  # cache every parameter
    torch.manual_seed(0)
    ref, net = nn.Linear(8, 8), nn.Linear(8, 8)
    net.load_state_dict(ref.state_dict())
    auto_mixed_precision(net, "O3", BF16)
    auto_mixed_precision(ref, "O3", BF16, cache_casts=False)
    opts = [torch.optim.AdamW(m.parameters(), lr=0.1, fused=True) for m in (net, ref)]
    x = torch.randn(4, 8)
    for _ in range(3):
        for m, o in zip((net, ref), opts):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
        with torch.no_grad():  # eval between steps reuses the cache, still up to date
            assert torch.equal(net(x), ref(x))
    assert "weight" in net.__dict__["_amp_cast_cache"]
    assert "_amp_cast_cache" not in ref.__dict__
    # a write through .data is invisible to the cache until invalidated
    with torch.no_grad():
        net.weight.data.mul_(0)
        ref.weight.data.mul_(0)
    invalidate_cast_cache(net)
    assert torch.equal(net(x), ref(x))


def test_large_parameters_are_cached_small_ones_cast_each_time():
    net = auto_mixed_precision(nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 2)), "O2", BF16)
    net(torch.randn(2, 512)).sum().backward()
    assert list(net[0].__dict__["_amp_cast_cache"]) == ["weight"]  # 2**18 elements
    assert "_amp_cast_cache" not in net[1].__dict__
    assert net[0].weight.grad.dtype == F32


def test_weight_sharing_and_two_forwards_before_backward(monkeypatch):
    monkeypatch.setattr(mp, "CACHE_MIN_NUMEL", 0)
    shared = nn.Linear(6, 6)
    net = auto_mixed_precision(nn.Sequential(shared, nn.Tanh(), shared), "O2", BF16)
    a, b = torch.randn(3, 6), torch.randn(3, 6)
    loss = net(a).sum() + net(b).sum()  # siamese: two passes, one backward
    loss.backward()
    assert shared.weight.grad.dtype == F32


def test_inference_mode_then_training(monkeypatch):
    monkeypatch.setattr(mp, "CACHE_MIN_NUMEL", 0)
    net = auto_mixed_precision(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), "O2", BF16)
    with torch.inference_mode():
        net(torch.randn(2, 4))
    net(torch.randn(2, 4)).sum().backward()
    assert net[0].weight.grad is not None


def test_float32_gradients_reuse_a_pooled_buffer_without_clobbering_held_grads(monkeypatch):
    """On CPU the fp32 gradient of a cached weight is written into a reused buffer (no fresh
    large allocation per step), but never into one somebody still holds."""
    monkeypatch.setattr(mp, "CACHE_MIN_NUMEL", 0)
    torch.manual_seed(0)
    ref, net = nn.Linear(8, 8), nn.Linear(8, 8)
    net.load_state_dict(ref.state_dict())
    auto_mixed_precision(net, "O2", BF16)
    auto_mixed_precision(ref, "O2", BF16, cache_casts=False)
    x1, x2 = torch.randn(4, 8), torch.randn(4, 8)

    # steady state: after set_to_none, the next gradient lands in the same storage
    net(x1).sum().backward()
    first_ptr = net.weight.grad.data_ptr()
    held = net.weight.grad  # a user keeps a reference across the next backward
    held_copy = held.clone()
    net.weight.grad = None
    net(x2).sum().backward()
    assert torch.equal(held, held_copy)  # the held tensor was not overwritten
    assert net.weight.grad.data_ptr() != first_ptr
    del held
    net.weight.grad = None
    net(x2).sum().backward()
    ptr = net.weight.grad.data_ptr()
    net.weight.grad = None
    net(x1).sum().backward()
    assert net.weight.grad.data_ptr() == ptr  # reused: no fresh allocation

    # accumulation without zeroing sums exactly like the uncached conversion
    net.weight.grad = None
    for m in (net, ref):
        m(x1).sum().backward()
        m(x2).sum().backward()
    assert torch.equal(net.weight.grad, ref.weight.grad)
    assert net.weight.grad.dtype == F32 and net.weight.grad.is_contiguous()


def _backward_names(out: torch.Tensor) -> set[str]:
    """The names of the autograd nodes of ``out``'s graph."""
    seen, todo = set(), [out.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and type(fn).__name__ not in seen:
            seen.add(type(fn).__name__)
            todo.extend(f for f, _ in fn.next_functions)
    return {n.replace("Backward", "") for n in seen}


@pytest.mark.parametrize("bias", [True, False])
def test_converted_linear_matches_plain_autograd_bit_for_bit(monkeypatch, bias):
    """A cached nn.Linear takes lit_amp's own backward (weight gradient into reused buffers);
    every gradient equals the one of PyTorch's own linear on the same low-precision copies."""
    monkeypatch.setattr(mp, "CACHE_MIN_NUMEL", 0)
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 16, bias=bias), nn.Tanh(), nn.Linear(16, 4, bias=bias))
    net = copy.deepcopy(ref)
    auto_mixed_precision(net, "O2", BF16)
    auto_mixed_precision(ref, "O2", BF16, cache_casts=False)
    x = torch.randn(5, 3, 8)  # a batch of sequences: leading dims are flattened
    # the cached net's first layer runs lit_amp's own backward, the uncached one PyTorch's
    assert "_LowLinear" in _backward_names(net[0](x.bfloat16()))
    assert "_LowLinear" not in _backward_names(ref[0](x.bfloat16()))
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    ptrs = None
    for _ in range(2):
        for m, xi in zip((net, ref), xs):
            m.zero_grad(set_to_none=True)
            xi.grad = None
            m(xi).square().sum().backward()
        for a, b in zip(net.parameters(), ref.parameters()):
            assert torch.equal(a.grad, b.grad) and a.grad.dtype == F32
        assert torch.equal(xs[0].grad, xs[1].grad)
        now = [p.grad.data_ptr() for p in net.parameters() if p.dim() == 2]
        if ptrs is not None:
            assert now == ptrs  # the weight gradients reused their buffers
        ptrs = now
    # a frozen weight gets no gradient; the input still does
    net[0].weight.requires_grad_(False)
    net[0].weight.grad = None
    net(xs[0]).sum().backward()
    assert net[0].weight.grad is None and net[2].weight.grad is not None
    # undoing the conversion restores nn.Linear's own forward
    remove_mixed_precision(net)
    assert "forward" not in net[0].__dict__
