"""AdaSum's hooks in plain torch DDP (2 gloo processes): DDP keeps each rank's gradient, the
optimizer hooks apply ``w0 - AdaSum(lr g0, lr g1)`` on both ranks."""

from __future__ import annotations

import torch
from torch import nn

from lit_amp.boost.adasum.hooks import AdaSumHooks, noop_comm_hook
from lit_amp.boost.adasum.maths import adasum_combine
from lit_amp.boost.adasum.transport import adasum_allreduce_
from tests.helpers.dist import run_distributed


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def _batch(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 3, generator=g), torch.randn(8, 2, generator=g)


def _worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    results = {}
    # adasum_allreduce_ on raw tensors
    t = [
        torch.tensor([1.0, 0.0]) if rank == 0 else torch.tensor([0.0, 1.0]),
        torch.tensor([float(rank)]),
    ]
    adasum_allreduce_(t)
    results["raw"] = [x.clone() for x in t]
    # DDP with the no-op comm hook + AdaSum optimizer hooks: each rank steps on its own
    # gradient, then both apply the AdaSum of the two deltas
    ddp = nn.parallel.DistributedDataParallel(_net())
    ddp.register_comm_hook(None, noop_comm_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    hooks = AdaSumHooks([opt])
    x, y = _batch(rank)
    nn.functional.mse_loss(ddp(x), y).backward()
    results["grads"] = [p.grad.clone() for p in ddp.parameters()]
    opt.step()
    results["after"] = [p.detach().clone() for p in ddp.parameters()]
    results["steps"] = hooks.steps
    hooks.remove()
    return results


def test_ddp_keeps_own_gradients_and_hooks_apply_adasum_of_the_deltas():
    r0, r1 = run_distributed(_worker, world=2)
    # raw tensors: orthogonal -> summed; a single element -> averaged
    for r in (r0, r1):
        torch.testing.assert_close(r["raw"][0], torch.tensor([1.0, 1.0]))
        torch.testing.assert_close(r["raw"][1], torch.tensor([0.5]))
    # DDP did not average: each rank kept its own gradient (the local batches differ)
    ref = _net()
    for rank, r in ((0, r0), (1, r1)):
        ref.zero_grad()
        x, y = _batch(rank)
        nn.functional.mse_loss(ref(x), y).backward()
        for g, p in zip(r["grads"], ref.parameters()):
            torch.testing.assert_close(g, p.grad)
    # both ranks end with w0 - AdaSum(lr*g0, lr*g1), computed tensor by tensor
    for i, w in enumerate(_net().parameters()):
        d0, d1 = 0.5 * r0["grads"][i], 0.5 * r1["grads"][i]
        expected = w.detach() - adasum_combine(d0, d1)
        torch.testing.assert_close(r0["after"][i], expected)
        torch.testing.assert_close(r1["after"][i], expected)
    assert r0["steps"] == r1["steps"] == 1


def test_without_distributed_the_hooks_do_nothing_but_count():
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    hooks = AdaSumHooks([opt])
    before = [p.detach().clone() for p in net.parameters()]
    x, y = _batch(0)
    nn.functional.mse_loss(net(x), y).backward()
    opt.step()
    # the plain SGD step, untouched
    for b, p in zip(before, net.parameters()):
        torch.testing.assert_close(p.detach(), b - 0.5 * p.grad)
    assert hooks.steps == 1
    hooks.remove()
    opt.step()
    assert hooks.steps == 1  # removed: no longer called
