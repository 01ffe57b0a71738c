"""The parameter swap of a conversion (lit_amp/amp/swap.py)."""

from __future__ import annotations

import torch
from torch import nn

from lit_amp.amp.swap import _B, _P, _STATS, AmpState, Frame, swap_in, swap_out

BF16, F32 = torch.bfloat16, torch.float32


def _entries(m: nn.Module) -> list:
    return [(m, n, _P) for n in m._parameters] + [
        (m, n, _STATS if isinstance(m, nn.BatchNorm1d) else _B)
        for n, b in m._buffers.items() if b.is_floating_point()]


def test_swap_in_puts_low_copies_and_swap_out_restores_the_same_tensors():
    bn = nn.BatchNorm1d(4)
    before = {**dict(bn._parameters), **dict(bn._buffers)}
    frame = Frame()
    swap_in(_entries(bn), AmpState("O3", BF16), frame)
    assert bn.weight.dtype == bn.running_mean.dtype == BF16
    assert bn.num_batches_tracked.dtype == torch.int64  # not floating: left alone
    bn(torch.randn(8, 4, dtype=BF16))
    swap_out(frame)
    assert all(bn._parameters.get(k, bn._buffers.get(k)) is t for k, t in before.items())
    assert bn.weight.dtype == F32
    # the running statistics the low forward updated were copied home, in float32
    assert bn.running_mean.dtype == F32 and bn.running_mean.abs().sum() > 0


def test_entries_already_low_or_float64_are_left():
    lin = nn.Linear(2, 2)
    lin.bias.data = lin.bias.data.double()
    low = lin.weight.detach().to(BF16)
    lin._parameters["weight"] = low
    frame = Frame()
    swap_in(_entries(lin), AmpState("O2", BF16), frame)
    assert not frame.params  # nothing swapped: nothing to restore
    assert lin._parameters["weight"] is low and lin.bias.dtype == torch.float64


def test_a_buffer_changed_in_place_in_eval_is_copied_home():
    m = nn.Module()
    m.register_buffer("ema", torch.zeros(3))
    m.eval()
    frame = Frame()
    swap_in([(m, "ema", _B)], AmpState("O3", BF16), frame)
    m.ema.add_(1)
    swap_out(frame)
    assert m.ema.dtype == F32 and torch.equal(m.ema, torch.ones(3))
