"""The AdaSum callback on 3 ranks, attached as Lightning attaches it: DDP's sync off, deltas
combined by vector halving, BatchNorm statistics averaged -- the same as a hand computation.

Lightning DDP with 2 ranks (and AdaSum within the O2 level) runs in the boost contract
(tests/boost/test_contract.py)."""

from __future__ import annotations

import torch
from torch import nn

from lit_amp.boost.adasum.maths import adasum_reduce
from tests.helpers.data import make_batches
from tests.helpers.dist import run_distributed


def _bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))


def _three_rank_training(rank: int, world: int) -> dict:
    """AdaSum (transport="auto") as Lightning attaches it, on 3 ranks: DDP's sync switched
    off, each rank steps on its own batches, deltas combined by vector halving, BatchNorm
    statistics averaged; 3 steps."""
    from types import SimpleNamespace

    from lit_amp.boost import AdaSum

    torch.set_num_threads(1)
    net = _bn_net()
    ddp = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    algo = AdaSum()
    algo.attach(net, [opt], trainer=SimpleNamespace(strategy=SimpleNamespace(model=ddp)))
    for x, y in make_batches(3, seed=rank):
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    used, steps = algo.transport_used, algo.hooks.steps
    during = type(ddp).__name__
    algo.detach()
    return {"ddp_class": (during, type(ddp).__name__),
            "weights": [p.detach().clone() for p in net.parameters()],
            "bn": [net[1].running_mean.clone(), net[1].running_var.clone()],
            "transport": used, "steps": steps}


def test_adasum_callback_on_three_ranks_uses_vector_halving():
    out = run_distributed(_three_rank_training, world=3)
    assert [r["transport"] for r in out] == ["process_group"] * 3
    assert [r["steps"] for r in out] == [3, 3, 3]
    # DDP's gradient sync was switched off by a per-instance subclass, undone by detach
    assert all(r["ddp_class"] == ("AdaSumDistributedDataParallel", "DistributedDataParallel")
               for r in out)
    # the same without communication: 3 replicas with their own momentum, w = w_old - AdaSum
    nets = [_bn_net() for _ in range(3)]
    opts = [torch.optim.SGD(n.parameters(), lr=0.2, momentum=0.9) for n in nets]
    data = [make_batches(3, seed=r) for r in range(3)]
    for step in range(3):
        olds, deltas = [], []
        for net, opt, batches in zip(nets, opts, data):
            x, y = batches[step]
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            olds.append([p.detach().clone() for p in net.parameters()])
            opt.step()
            deltas.append([o - p.detach() for o, p in zip(olds[-1], net.parameters())])
        combined = adasum_reduce(deltas)
        mean = [torch.stack([n[1].running_mean for n in nets]).mean(0),
                torch.stack([n[1].running_var for n in nets]).mean(0)]
        with torch.no_grad():
            for net in nets:
                for p, o, c in zip(net.parameters(), olds[0], combined):
                    p.copy_(o - c)
                net[1].running_mean.copy_(mean[0])
                net[1].running_var.copy_(mean[1])
    for r in out:
        for got, want in zip(r["weights"], nets[0].parameters()):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
        for got, want in zip(r["bn"], (nets[0][1].running_mean, nets[0][1].running_var)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # weights and BatchNorm statistics identical on every rank, bit for bit
    for r in out[1:]:
        for a, b in zip(r["weights"] + r["bn"], out[0]["weights"] + out[0]["bn"]):
            assert torch.equal(a, b)
