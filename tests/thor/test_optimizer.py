"""THOR optimizer: the frequency schedule, hooks, schedules, update rule, state (its argument
checks: tests/thor/test_arguments.py)."""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_amp.thor.optimizer import THOR, ParamInfo, thor


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))


def _batch(step: int, n: int = 16):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def _train(net, opt, steps, start=0, record=None):
    for k in range(start, start + steps):
        x, y = _batch(k)
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        if record is not None:
            record.append(opt.is_second_order_step)
        opt.step()


def _hooked(net) -> list[bool]:
    return [bool(m._forward_hooks) for m in net if isinstance(m, nn.Linear)]


def test_hooks_only_on_second_order_steps():
    net = _net()
    opt = thor(net, 0.05, 0.03, 0.9, frequency=3)
    seen = []
    for k in range(7):
        seen.append(_hooked(net))
        _train(net, opt, 1, start=k)
    assert seen == [[k % 3 == 0] * 2 for k in range(7)]
    # first-order steps: no hook at all on the modules, so the forward pass costs nothing extra
    assert not any(_hooked(net)) and opt.steps == 7 and not opt.is_second_order_step


def test_frequency_schedule_counts():
    net = _net()
    opt = thor(net, 0.05, 0.03, 0.9, frequency=4, trace_thresholds=(0.0, 0.0))
    record = []
    _train(net, opt, 10, record=record)
    assert record == [k % 4 == 0 for k in range(10)]
    assert opt.refreshes == 3  # steps 0, 4, 8
    assert opt.inversions == 3 * 2 * 2  # A and G of both layers at each refresh
    # frequency=1 (THOR class only): every step refreshes
    net = _net()
    opt = THOR(net, 0.05, 0.03, 0.9, frequency=1)
    _train(net, opt, 3)
    assert opt.refreshes == 3


def test_first_order_steps_reuse_the_inverses():
    net = _net()
    opt = thor(net, 0.05, 0.03, 0.9, frequency=5, trace_thresholds=(0.0, 0.0))
    _train(net, opt, 1)
    inv = [lf.A_inv.clone() for lf in opt.layers]
    _train(net, opt, 3, start=1)
    assert all(torch.equal(a, lf.A_inv) for a, lf in zip(inv, opt.layers))
    _train(net, opt, 2, start=4)  # step 5 refreshes
    assert not all(torch.equal(a, lf.A_inv) for a, lf in zip(inv, opt.layers))


def test_per_step_learning_rate_and_damping_indexing():
    net = _net()
    lrs = torch.tensor([0.1, 0.01, 0.001, 0.0001])
    damping = torch.tensor([0.3, 0.2, 0.1, 0.05])
    opt = thor(net, lrs, damping, 0.0, frequency=2, factor_decay=0.0)
    bias = net[2].bias
    for k in range(4):
        x, y = _batch(k)
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        g = bias.grad.clone()
        before = bias.detach().clone()
        opt.step()
        # the bias is a plain parameter: w -= lr[k] * g
        torch.testing.assert_close(before - bias.detach(), lrs[k] * g)
        assert opt.param_groups[0]["lr"] == pytest.approx(float(lrs[k]))
        if k == 2:  # a refresh: the inverse uses damping[2]
            lf = opt.layers[0]
            expected = torch.linalg.inv(lf.A + math.sqrt(0.1) * torch.eye(6))
            torch.testing.assert_close(lf.A_inv, expected, rtol=1e-4, atol=1e-5)
    x, y = _batch(9)
    F.cross_entropy(net(x), y).backward()
    with pytest.raises(ValueError, match="holds 4 per-step values but step 4 needs one"):
        opt.step()


def test_callable_schedules_and_torch_lr_scheduler():
    net = _net()
    opt = thor(net, lambda k: 0.1 / (k + 1), lambda k: 0.03, 0.9, frequency=2)
    _train(net, opt, 3)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 / 3)
    net = _net()
    opt = thor(net, 0.1, 0.03, 0.9, frequency=2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for k in range(2):
        _train(net, opt, 1, start=k)
        sched.step()
    assert opt.current_lr() == pytest.approx(0.025)


@pytest.mark.parametrize("kw", [{}, {"use_nesterov": True}, {"weight_decay": 0.01}])
def test_plain_parameters_follow_momentum_sgd(kw):
    net = _net()
    opt = thor(net, 0.1, 0.03, 0.9, frequency=2, **kw)
    bias = net[2].bias
    ref_p = nn.Parameter(bias.detach().clone())
    ref = torch.optim.SGD(
        [ref_p],
        lr=0.1,
        momentum=0.9,
        nesterov=kw.get("use_nesterov", False),
        weight_decay=kw.get("weight_decay", 0.0),
    )
    for k in range(3):
        x, y = _batch(k)
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        ref_p.grad = bias.grad.clone()
        ref_p.data.copy_(bias.detach())
        opt.step()
        ref.step()
        torch.testing.assert_close(bias.detach(), ref_p.detach())


def test_decay_filter_and_clip():
    net = _net()
    names = []

    def flt(info: ParamInfo) -> bool:
        names.append(info.name)
        return "bias" not in info.name

    opt = thor(
        net, 1.0, 0.03, 0.0, weight_decay=0.5, decay_filter=flt, enable_clip_grad=True, frequency=2
    )
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias"]
    before = [p.detach().clone() for p in net.parameters()]
    _train(net, opt, 1)
    # per-tensor clip to norm 1.0 (lr 1, no momentum): every update has norm <= 1
    for b, p in zip(before, net.parameters()):
        assert (b - p.detach()).norm() <= 1.0 + 1e-5


def test_layernorm_diagonal_fisher():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 5), nn.LayerNorm(5), nn.Linear(5, 2))
    lam, bs = 0.04, 32
    opt = thor(net, 1.0, lam, 0.0, batch_size=bs, frequency=2)
    ln = net[1]
    for _ in range(2):  # a second-order and a first-order step: both use the diagonal rule
        x = torch.randn(8, 4)
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        g = ln.weight.grad.clone()
        w0 = ln.weight.detach().clone()
        opt.step()
        expected = g / (g * g / bs + math.sqrt(lam))
        torch.testing.assert_close(w0 - ln.weight.detach(), expected)


def test_loss_scale_divides_gradients_and_g():
    """Backward with loss x S and loss_scale=S gives the unscaled trajectory."""
    n1, n2 = _net(), _net()
    o1 = thor(n1, 0.05, 0.03, 0.9, frequency=2)
    o2 = thor(n2, 0.05, 0.03, 0.9, frequency=2, loss_scale=128.0)
    for k in range(4):
        x, y = _batch(k)
        for net, opt, s in ((n1, o1, 1.0), (n2, o2, 128.0)):
            opt.zero_grad()
            (F.cross_entropy(net(x), y) * s).backward()
            opt.step()
    for a, b in zip(n1.parameters(), n2.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # grad_scale overrides the assumption "backward scale == loss_scale"
    n3 = _net()
    o3 = thor(n3, 0.05, 0.03, 0.9, frequency=2, grad_scale=lambda: 64.0)
    for k in range(4):
        x, y = _batch(k)
        o3.zero_grad()
        (F.cross_entropy(n3(x), y) * 64.0).backward()
        for p in n3.parameters():
            p.grad /= 64.0  # what a loss scaler's unscale_ does
        o3.step()
    for a, b in zip(n1.parameters(), n3.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_skipped_overflow_step_does_not_corrupt_statistics():
    net, ref_net = _net(), _net()
    opt = thor(net, 0.05, 0.03, 0.9, frequency=2, factor_decay=0.0)
    ref = thor(ref_net, 0.05, 0.03, 0.9, frequency=2, factor_decay=0.0)
    x, y = _batch(0)
    # an overflowing step that the loss scaler skips: no optimizer.step()
    opt.zero_grad()
    (F.cross_entropy(net(x), y) * float("inf")).backward()
    # the next (good) batch
    x, y = _batch(1)
    for n, o in ((net, opt), (ref_net, ref)):
        o.zero_grad()
        F.cross_entropy(n(x), y).backward()
        o.step()
    for lf, rf in zip(opt.layers, ref.layers):
        torch.testing.assert_close(lf.A, rf.A)
        torch.testing.assert_close(lf.G, rf.G)
        assert torch.isfinite(lf.A_inv).all() and torch.isfinite(lf.G_inv).all()
    # an applied step with non-finite statistics keeps the previous factors
    a_before = [lf.A.clone() for lf in opt.layers]
    _train(net, opt, 1, start=2)  # first-order
    opt.zero_grad()
    x, y = _batch(3)
    x[0, 0] = float("nan")
    F.cross_entropy(net(x), y).backward()
    for p in net.parameters():
        p.grad = torch.nan_to_num(p.grad, nan=0.0)
    opt.step()
    assert all(torch.equal(a, lf.A) for a, lf in zip(a_before, opt.layers))


def test_running_average_of_factors():
    net = _net()
    opt = thor(net, 0.0, 0.03, 0.0, frequency=2, factor_decay=0.75)
    a_batches = []
    for k in range(3):
        x, y = _batch(k)
        if k % 2 == 0:
            a_batches.append(x.t() @ x / x.shape[0])
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    expected = 0.75 * a_batches[0] + 0.25 * a_batches[1]
    torch.testing.assert_close(opt.layers[0].A, expected, rtol=1e-5, atol=1e-6)


def test_trace_rule_skips_and_stops_refreshing():
    net = _net()
    opt = thor(net, 0.0, 0.03, 0.0, frequency=2, trace_thresholds=(1e9, 0.0))
    _train(net, opt, 6)
    assert opt.refreshes == 3 and opt.inversions == 4  # only the first refresh inverts
    net = _net()
    opt = thor(net, 0.0, 0.03, 0.0, frequency=2, trace_thresholds=(1e9, 1e9))
    _train(net, opt, 4)
    # the second refresh found Δ < ω2: every factor stops for good, hooks are gone for good
    assert all(all(lf.frozen) for lf in opt.layers)
    assert opt.inversions == 4 and not any(_hooked(net))
    _train(net, opt, 2, start=4)
    assert not any(_hooked(net)) and opt.inversions == 4


def test_checkpoint_and_resume_mid_window():
    net = _net()
    opt = thor(net, torch.full((12,), 0.05), 0.03, 0.9, frequency=3)
    _train(net, opt, 5)
    buf = io.BytesIO()
    torch.save({"net": net.state_dict(), "opt": opt.state_dict()}, buf)
    _train(net, opt, 6, start=5)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    net2 = _net(seed=1)  # different init: everything must come from the checkpoint
    opt2 = thor(net2, torch.full((12,), 0.05), 0.03, 0.9, frequency=3)
    net2.load_state_dict(ckpt["net"])
    opt2.load_state_dict(ckpt["opt"])
    assert opt2.steps == 5 and not opt2.is_second_order_step and not any(_hooked(net2))
    _train(net2, opt2, 6, start=5)
    for a, b in zip(net.parameters(), net2.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert opt2.inversions == opt.inversions
    bad = thor(nn.Linear(6, 3), 0.1, 0.03, 0.9)
    with pytest.raises(ValueError, match="preconditioned layers"):
        bad.load_state_dict(opt.state_dict())


def test_closure_and_conv1d_network():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv1d(1, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 10, 3)
    )
    opt = thor(net, 0.05, 0.03, 0.9, frequency=2)
    x, y = torch.randn(8, 1, 20), torch.randint(0, 3, (8,))

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        return loss

    losses = [float(opt.step(closure).detach()) for _ in range(6)]
    assert losses[-1] < losses[0] and len(opt.layers) == 2


def test_a_restored_step_counter_places_a_per_step_array_cut_at_the_resume_step():
    """Issue #51: the model zoo cuts its arrays at the resume step (``get_thor_lr(k, ...)``);
    with the counter restored, each step still takes the uninterrupted run's values."""
    from lit_amp.thor import get_thor_damping, get_thor_lr

    def lr(start: int) -> torch.Tensor:
        return get_thor_lr(start, 0.1, 2.0, 4, 3)  # 12 steps

    def damping(start: int) -> torch.Tensor:
        return get_thor_damping(start, 0.03, 0.5, 4, 3)

    def resumed(state, lr_array, damping_array=None):
        opt = thor(_net(), lr_array, damping(0) if damping_array is None else damping_array,
                   0.9, frequency=2)
        opt.load_state_dict(state)
        return opt

    net = _net()
    opt = thor(net, lr(0), damping(0), 0.9, frequency=2)
    _train(net, opt, 6)
    state = opt.state_dict()
    full = lr(0)
    assert resumed(state, full).current_lr() == float(full[6])  # the saved array: [counter]
    cut = resumed(state, lr(6), damping(6))  # cut at the resume step
    assert (cut.steps, cut.current_lr(), cut._damping_at(6)) == (6, float(full[6]),
                                                                  float(damping(0)[6]))
    assert resumed(state, lr(4)).current_lr() == float(full[6])  # cut before it
    with pytest.raises(ValueError, match="from step 9 on.*saved at step 6"):
        resumed(state, lr(9))  # cut after it: steps 6..8 have no rate
    with pytest.warns(UserWarning, match="indexed by the restored step counter"):
        other = resumed(state, full * 0.5)
    assert other.current_lr() == float(full[6] * 0.5)
    # a resumed run's state places its cut array again; a state without arrays (written
    # before they were saved) lets the counter index the array, as before
    again = cut.state_dict()
    again["thor"]["steps"] = 9
    assert resumed(again, lr(9)).current_lr() == float(full[9])
    assert resumed(again, full).current_lr() == float(full[9])
    old = {**state, "thor": {k: v for k, v in state["thor"].items() if k != "schedules"}}
    assert resumed(old, lr(3)).current_lr() == float(lr(3)[6])
