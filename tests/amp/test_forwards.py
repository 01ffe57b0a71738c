"""O2 and O3 run on replaced forwards, with no forward hook (lit_amp/amp/forwards.py)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from lit_amp.amp.convert import auto_mixed_precision, remove_mixed_precision

BF16, F32 = torch.bfloat16, torch.float32


class Net(nn.Module):
    """A float32 tensor made inside the forward meets a low layer (PyTorch would promote)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.norm = nn.LayerNorm(8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm(self.fc1(x)))
        return self.fc2(h + torch.full((8,), 0.5))  # float32 + low -> float32


def _seen_by_linear(monkeypatch) -> list:
    seen = []
    real = nn.functional.linear

    def linear(x, w, b=None):
        seen.append((x.dtype, w.dtype))
        return real(x, w, b)

    monkeypatch.setattr(nn.functional, "linear", linear)
    return seen


@pytest.mark.parametrize("level", ["O2", "O3"])
def test_no_hook_runs_and_every_linear_computes_low(monkeypatch, level):
    torch.manual_seed(0)
    net = auto_mixed_precision(Net(), level, BF16)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in net.modules())
    seen = _seen_by_linear(monkeypatch)
    out = net(torch.randn(4, 6))
    assert out.dtype == F32
    # the float32 sum made inside the forward was cast at fc2's entry, as MindSpore's cell does
    assert seen == [(BF16, BF16), (BF16, BF16)]
    out.sum().backward()
    assert all(p.dtype == F32 and p.grad.dtype == F32 for p in net.parameters())


def test_a_layer_called_outside_the_network_swaps_its_own_parameters(monkeypatch):
    net = auto_mixed_precision(Net(), "O2", BF16)
    seen = _seen_by_linear(monkeypatch)
    weight = net.fc1.weight
    out = net.fc1(torch.randn(2, 6))
    assert seen == [(BF16, BF16)] and out.dtype == BF16
    assert net.fc1.weight is weight and weight.dtype == F32  # restored after the call


def test_parameters_gathered_after_the_roots_swap_are_swapped_by_their_layer(monkeypatch):
    """A sharded strategy puts a freshly gathered float32 parameter in place in the layer's own
    pre-forward and the shard back after it (FSDP2's unshard / reshard): the layer casts the
    gathered one for its call, and its gradient reaches it in float32."""
    net = auto_mixed_precision(Net(), "O2", BF16)
    shard = net.fc2.weight
    gathered = nn.Parameter(shard.detach().clone())
    net.fc2.register_forward_pre_hook(lambda m, a: m._parameters.__setitem__("weight", gathered))
    net.fc2.register_forward_hook(lambda m, a, o: m._parameters.__setitem__("weight", shard))
    seen = _seen_by_linear(monkeypatch)
    net(torch.randn(3, 6)).sum().backward()
    assert seen[-1] == (BF16, BF16)
    assert gathered.grad is not None and gathered.grad.dtype == F32
    assert net.fc2.weight is shard and shard.dtype == F32


def test_a_module_with_its_own_instance_forward_gets_hooks_instead(monkeypatch):
    net = Net()
    net.fc2.forward = lambda x: nn.Linear.forward(net.fc2, x)  # a user's patch
    auto_mixed_precision(net, "O2", BF16)
    assert net.fc2._forward_pre_hooks and not net.fc1._forward_pre_hooks
    seen = _seen_by_linear(monkeypatch)
    assert net(torch.randn(2, 6)).dtype == F32
    assert seen == [(BF16, BF16), (BF16, BF16)]


def test_converted_networks_copy_pickle_and_unconvert():
    torch.manual_seed(0)
    net = auto_mixed_precision(Net(), "O2", BF16)
    x = torch.randn(5, 6)
    ref = net(x)
    for other in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        assert torch.equal(other(x), ref)
        assert other.fc1.forward.args[-1] is other.fc1  # bound to the copy, not the original
    remove_mixed_precision(net)
    assert not any("forward" in m.__dict__ for m in net.modules())
    assert net(x).dtype == F32 and not torch.equal(net(x), ref)
