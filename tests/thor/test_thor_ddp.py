"""THOR under torch.distributed: 2 CPU processes, gloo (``tests/helpers/dist.py``).

Each rank sees different data; the factors are all-reduced before inversion, so every rank
must end with identical factors, inverses and parameters, and the factors must be the mean of
the ranks' own statistics.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lit_amp.thor.optimizer import thor
from tests.helpers.dist import run_distributed

STEPS = 5


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv1d(1, 3, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 8, 4)
    )


def _data(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 1, 16, generator=g), torch.randint(0, 4, (8,), generator=g)


def _worker(rank: int, world: int, kw: dict) -> dict:
    torch.set_num_threads(1)
    net = _net()
    ddp = nn.parallel.DistributedDataParallel(net)
    opt = thor(net, 0.05, 0.03, 0.9, frequency=2, factor_decay=0.0, split_indices=[0], **kw)
    # this rank's own statistics of the first batch, before any step
    lnet = _net()
    local = thor(lnet, 0.05, 0.03, 0.9, frequency=2, factor_decay=0.0, **kw)
    x, y = _data(rank, 0)
    F.cross_entropy(lnet(x), y).backward()
    own = [lf.take_pending(1.0) for lf in local.layers]
    first = None
    for step in range(STEPS):
        x, y = _data(rank, step)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        if step == 0:
            first = [(lf.A.clone(), lf.G.clone()) for lf in opt.layers]
    return {
        "params": [p.detach().clone() for p in net.parameters()],
        "inv": [(lf.A_inv, lf.G_inv) for lf in opt.layers],
        "first": first,
        "own": own,
        "refreshes": opt.refreshes,
    }


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("kw", [{}, {"pi_damping": True, "bias_in_a": True}])
def test_ranks_stay_identical_and_factors_are_averaged(kw):
    r0, r1 = run_distributed(_worker, world=2, args=(kw,))
    assert r0["refreshes"] == r1["refreshes"] == 3
    for a, b in zip(r0["params"], r1["params"]):
        assert torch.equal(a, b)
    for (a0, g0), (a1, g1) in zip(r0["inv"], r1["inv"]):
        assert torch.equal(a0, a1) and torch.equal(g0, g1)
    # the first refresh used the mean of the two ranks' own factors
    for (a, g), (a_0, g_0), (a_1, g_1) in zip(r0["first"], r0["own"], r1["own"]):
        torch.testing.assert_close(a, (a_0 + a_1) / 2)
        torch.testing.assert_close(g, (g_0 + g_1) / 2)
    assert not torch.allclose(r0["own"][0][0], r1["own"][0][0])  # the ranks' data differ
