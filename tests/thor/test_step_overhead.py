"""THOR's leaner step (issue #20, round 2): one momentum kernel, torch's step wrapper only when
something observes the step, and the behaviour users rely on kept (hooks, profiler labels,
``zero_grad``, checkpoints)."""

from __future__ import annotations

import io

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from lit_amp.thor.optimizer import RECOMMENDED_RECIPE, THOR


def _setup(seed: int = 0) -> tuple[nn.Module, THOR]:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
    return net, THOR(net, 0.05, 0.03, 0.9, weight_decay=0.01, **RECOMMENDED_RECIPE)


def _train(net: nn.Module, opt: THOR, steps: int, start: int = 0) -> None:
    for k in range(start, start + steps):
        g = torch.Generator().manual_seed(k)
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()


def test_momentum_buffers_are_views_of_one_flat_tensor():
    net, opt = _setup()
    _train(net, opt, 3)
    bufs = [opt.state[p]["momentum_buffer"] for p in net.parameters()]
    assert len({b.untyped_storage().data_ptr() for b in bufs}) == 1
    assert [b.shape for b in bufs] == [p.shape for p in net.parameters()]


def test_momentum_buffer_replaced_from_outside_is_used():
    net, opt = _setup()
    ref_net, ref_opt = _setup()
    _train(net, opt, 4)
    _train(ref_net, ref_opt, 4)
    for o in (opt, ref_opt):  # the same user edit on both: a fresh tensor, then an in-place one
        p0, p1 = list(o.state)[:2]
        o.state[p0]["momentum_buffer"] = torch.zeros_like(p0)
        o.state[p1]["momentum_buffer"].mul_(0.5)
    _train(net, opt, 4, start=4)
    _train(ref_net, ref_opt, 4, start=4)
    for a, b in zip(net.parameters(), ref_net.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # and it changed the trajectory (the edit was not ignored)
    plain_net, plain_opt = _setup()
    _train(plain_net, plain_opt, 8)
    assert not torch.equal(next(net.parameters()), next(plain_net.parameters()))


def test_step_hooks_still_run():
    net, opt = _setup()
    calls: list[str] = []
    opt.register_step_pre_hook(lambda o, a, k: calls.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: calls.append("post"))
    handle = register_optimizer_step_post_hook(lambda o, a, k: calls.append("global"))
    try:
        _train(net, opt, 2)
    finally:
        handle.remove()
    assert calls == ["pre", "post", "global"] * 2
    assert opt.steps == 2


def test_profiler_still_sees_step_and_zero_grad():
    net, opt = _setup()
    _train(net, opt, 1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _train(net, opt, 2, start=1)
    names = {e.key for e in prof.key_averages()}
    assert "Optimizer.step#THOR.step" in names
    assert "Optimizer.zero_grad#THOR.zero_grad" in names


def test_zero_grad_to_zero_and_to_none():
    net, opt = _setup()
    _train(net, opt, 1)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in net.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_checkpoint_of_flat_buffers_round_trips():
    net, opt = _setup()
    _train(net, opt, 5)
    buf = io.BytesIO()
    torch.save({"net": net.state_dict(), "opt": opt.state_dict()}, buf)
    _train(net, opt, 6, start=5)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    net2, opt2 = _setup(seed=1)
    net2.load_state_dict(ckpt["net"])
    opt2.load_state_dict(ckpt["opt"])
    _train(net2, opt2, 6, start=5)
    for a, b in zip(net.parameters(), net2.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
