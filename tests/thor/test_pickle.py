"""THOR survives pickling (ddp_spawn, multiprocessing) with its whole state (#17.4)."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_amp.thor.optimizer import thor


def _batch(step: int, n: int = 16):
    g = torch.Generator().manual_seed(300 + step)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def _train(net, opt, start, steps):
    losses = []
    for k in range(start, start + steps):
        x, y = _batch(k)
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("done", [0, 4, 5])  # before any factor, mid-window, on a refresh step
def test_round_trip_keeps_state_and_steps_identically(done):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
    opt = thor(net, 0.05, 0.03, 0.9, weight_decay=1e-3, frequency=5)
    _train(net, opt, 0, done)
    net2, opt2 = pickle.loads(pickle.dumps((net, opt)))
    assert (opt2.steps, opt2.refreshes, opt2.inversions) == (opt.steps, opt.refreshes,
                                                            opt.inversions)
    assert opt2.is_second_order_step == opt.is_second_order_step
    # the copy's layers and momentum buffers belong to the copy's network, not the original's
    assert opt2.layers[0].module is net2[0]
    assert all(p2 in opt2.state or p not in opt.state
               for p, p2 in zip(net.parameters(), net2.parameters()))
    # both continue through refreshes and first-order steps with identical results
    assert _train(net2, opt2, done, 12) == _train(net, opt, done, 12)
    for p, p2 in zip(net.parameters(), net2.parameters()):
        torch.testing.assert_close(p2, p, rtol=0, atol=0)
    assert (opt2.steps, opt2.inversions) == (opt.steps, opt.inversions)
    # the hooks moved with the copy: the original's hooks never fire for the copy's network
    assert [bool(m._forward_hooks) for m in (net2[0], net2[2])] == [
        bool(m._forward_hooks) for m in (net[0], net[2])
    ]


def test_optimizer_alone_pickles():
    net = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))
    opt = thor(net, 0.05, 0.03, 0.9, frequency=2)
    _train(net, opt, 0, 3)
    opt2 = pickle.loads(pickle.dumps(opt))
    assert opt2.steps == 3 and len(opt2.layers) == 2
    assert opt2.state_dict()["thor"]["steps"] == 3
