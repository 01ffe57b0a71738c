"""LossScaleController: train-step semantics of spec §2.7 (scale, unscale, skip, update, state)."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch
from torch import nn

from lit_amp.amp.loss_scale.controller import LossScaleController
from lit_amp.amp.loss_scale.managers import (
    DynamicLossScaleManager,
    FixedLossScaleManager,
)

NAN = float("nan")


class SpecDeviceRule:
    """Spec §2.6 device-side rule, transcribed independently (fp32 via numpy)."""

    def __init__(self, ls: float, factor: float, window: int) -> None:
        self.ls, self.factor, self.window = np.float32(ls), np.float32(factor), window
        self.cur_iter, self.last_overflow_iter = 1, 0

    def __call__(self, overflow: bool) -> float:
        ls_ovf = max(np.float32(self.ls / self.factor), np.float32(1.0)) if overflow else self.ls
        should_inc = (self.cur_iter - self.last_overflow_iter) >= self.window
        if overflow or should_inc:
            self.last_overflow_iter = self.cur_iter
        self.ls = np.float32(ls_ovf * self.factor) if (should_inc and not overflow) else ls_ovf
        self.cur_iter += 1
        return float(self.ls)


def mlp(seed: int = 0, d_in: int = 8, hidden: int = 16, d_out: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, d_out))


def batches(n: int, seed: int = 1, d_in: int = 8, d_out: int = 3, bs: int = 32):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(bs, d_in, generator=g), torch.randint(0, d_out, (bs,), generator=g))
        for _ in range(n)
    ]


class Injector:
    """Gradient hook that turns a parameter's gradient non-finite when armed."""

    def __init__(self, param: torch.Tensor, value: float = NAN) -> None:
        self.armed = False
        self.value = value
        param.register_hook(self._hook)

    def _hook(self, grad: torch.Tensor) -> torch.Tensor:
        if self.armed:
            grad = grad.clone()
            grad.view(-1)[0] = self.value
        return grad


def snapshot(net: nn.Module, opt: torch.optim.Optimizer, sched=None):
    state = {
        "params": [p.detach().clone() for p in net.parameters()],
        "opt": copy.deepcopy(opt.state_dict()),
        "lr": [g["lr"] for g in opt.param_groups],
    }
    if sched is not None:
        state["sched"] = copy.deepcopy(sched.state_dict())
    return state


def assert_same(a, b):
    assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))
    assert a["lr"] == b["lr"]
    sa, sb = a["opt"]["state"], b["opt"]["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        for name in sa[k]:
            assert torch.equal(torch.as_tensor(sa[k][name]), torch.as_tensor(sb[k][name])), name
    if "sched" in a:
        assert a["sched"] == b["sched"]


# --------------------------------------------------------------------------------- basic API
def test_disabled_controller_is_a_noop():
    ctl = LossScaleController(None)
    assert not ctl.enabled and ctl.scale == 1.0 and not ctl.drop_overflow_update
    loss = torch.tensor(2.0, requires_grad=True)
    assert ctl.scale_loss(loss) is loss
    net = nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net(torch.ones(1, 2)).sum().mul(NAN).backward()
    grad = net.weight.grad.clone()
    ctl.unscale_(opt)
    assert torch.equal(grad.isnan(), net.weight.grad.isnan())
    assert ctl.found_overflow([opt]) is False and ctl.should_skip(True) is False
    ctl.update(True)
    assert ctl.steps == 0 and ctl.skipped_steps == 0
    loss_t, ovf, scale = ctl.step_outputs(torch.tensor(3.0))
    assert float(loss_t) == 3.0 and not bool(ovf) and float(scale) == 1.0
    assert ctl.state_dict()["enabled"] is False


def test_scale_loss_leaves_loss_untouched():
    ctl = LossScaleController(DynamicLossScaleManager(2**10))
    loss = torch.tensor(0.75, requires_grad=True)
    scaled = ctl.scale_loss(loss)
    assert float(scaled.detach()) == 768.0 and float(loss.detach()) == 0.75 and scaled is not loss
    scaled.backward()
    assert float(loss.grad) == 1024.0


def test_unscale_divides_once_and_checks():
    net = mlp()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = batches(1)[0]
    nn.functional.cross_entropy(net(x), y).backward()
    true_grads = [p.grad.clone() for p in net.parameters()]
    opt.zero_grad()
    ctl = LossScaleController(DynamicLossScaleManager(2**12))
    ctl.scale_loss(nn.functional.cross_entropy(net(x), y)).backward()
    ctl.unscale_(opt)
    ctl.unscale_(opt)  # at most once per step
    for p, g in zip(net.parameters(), true_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-6, atol=1e-7)
    assert ctl.found_overflow([opt]) is False


def test_unscale_through_lightning_optimizer_wrapper():
    from lightning.pytorch.core.optimizer import LightningOptimizer

    net = nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ctl = LossScaleController(FixedLossScaleManager(64.0))
    net.weight.grad = torch.full_like(net.weight, 64.0)
    ctl.unscale_(LightningOptimizer(opt))
    ctl.unscale_(opt)  # same optimizer underneath: not unscaled twice
    assert torch.equal(net.weight.grad, torch.ones_like(net.weight))


def test_shared_parameter_unscaled_once():
    shared = nn.Parameter(torch.zeros(2))
    o1 = torch.optim.SGD([shared], lr=0.1)
    o2 = torch.optim.SGD([shared], lr=0.1)
    shared.grad = torch.full((2,), 8.0)
    ctl = LossScaleController(FixedLossScaleManager(8.0))
    ctl.unscale_(o1)
    ctl.unscale_(o2)
    assert torch.equal(shared.grad, torch.ones(2))


@pytest.mark.parametrize("value", [NAN, float("inf"), -float("inf")])
def test_found_overflow_detects_any_nonfinite(value):
    net = mlp()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ctl = LossScaleController(DynamicLossScaleManager())
    for p in net.parameters():
        p.grad = torch.randn_like(p) * 1e30  # huge but finite: not an overflow
    assert ctl.found_overflow([opt]) is False  # checked without unscale_ (factor 1)
    ctl.update(False)
    list(net.parameters())[2].grad[1, 4] = value
    ctl.unscale_(opt)
    assert ctl.found_overflow(opt) is True


def test_sparse_gradients():
    emb = nn.Embedding(10, 4, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    ctl = LossScaleController(FixedLossScaleManager(4.0))
    ctl.scale_loss(emb(torch.tensor([1, 2, 2])).sum()).backward()
    ctl.unscale_(opt)
    dense = emb.weight.grad.to_dense()
    assert float(dense[2, 0]) == 2.0 and float(dense[1, 0]) == 1.0
    assert ctl.found_overflow([opt]) is False


def test_step_outputs():
    ctl = LossScaleController(DynamicLossScaleManager(2**5, 2, 100))
    ctl.update(True)
    loss, ovf, scale = ctl.step_outputs(torch.tensor(1.5, requires_grad=True))
    assert not loss.requires_grad and float(loss) == 1.5
    assert ovf.dtype == torch.bool and bool(ovf)
    assert scale.dtype == torch.float32 and float(scale) == 32.0 and ctl.scale == 16.0
    assert ctl.last_overflow and ctl.last_skipped and ctl.last_scale_used == 32.0


def test_clip_fn_sees_unscaled_gradients():
    net = mlp()
    x, y = batches(1)[0]
    nn.functional.cross_entropy(net(x), y).backward()
    true_norm = torch.nn.utils.clip_grad_norm_(net.parameters(), float("inf"))
    net.zero_grad()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ctl = LossScaleController(DynamicLossScaleManager())
    seen = []
    ctl.step(
        opt,
        nn.functional.cross_entropy(net(x), y),
        clip_fn=lambda: seen.append(torch.nn.utils.clip_grad_norm_(net.parameters(), 0.01)),
    )
    torch.testing.assert_close(seen[0], true_norm, rtol=1e-5, atol=0)


# ------------------------------------------------------------------------- scale trajectory
def test_update_follows_spec_trajectory_including_overflow_at_growth_step():
    window = 4
    rng = np.random.default_rng(5)
    pattern = list(rng.random(300) < 0.12)
    pattern[: 2 * window] = [False] * (2 * window)
    pattern[2 * window - 1] = True  # the 2nd growth step overflows
    ctl = LossScaleController(DynamicLossScaleManager(2**10, 2, window))
    ref = SpecDeviceRule(2**10, 2, window)
    for i, ovf in enumerate(pattern):
        used = ctl.scale
        ctl.update(ovf)
        assert ctl.last_scale_used == used
        assert ctl.scale == ref(ovf), i
    assert ctl.steps == len(pattern) and ctl.skipped_steps == sum(pattern)


def test_hysteresis_and_clamps_through_controller():
    m = DynamicLossScaleManager(64.0, 2, 2, hysteresis=2, min_loss_scale=16.0, max_loss_scale=128.0)
    ctl = LossScaleController(m)
    seq = []
    for o in [True, True, True, True, False, False, False, False, False, False]:
        ctl.update(o)
        seq.append(ctl.scale)
    assert seq == [64, 32, 16, 16, 16, 32, 32, 64, 64, 128]
    assert ctl.skipped_steps == 4  # tolerated overflows are still skipped


# --------------------------------------------------------------------------- skip semantics
def test_skipped_steps_leave_params_adam_state_and_lr_schedule_untouched():
    """Raw loop: controller.step + a torch LR scheduler stepped only when not skipped."""
    data = batches(24)
    bad_steps = {0, 5, 6, 13, 20}

    net = mlp()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    ctl = LossScaleController(DynamicLossScaleManager(2**8, 2, 3))
    inj = Injector(net[2].weight)
    for i, (x, y) in enumerate(data):
        before = snapshot(net, opt, sched)
        inj.armed = i in bad_steps
        opt.zero_grad()
        loss, overflow, scale = ctl.step(opt, nn.functional.cross_entropy(net(x), y))
        if not ctl.last_skipped:  # the pattern: the schedule advances only on applied steps
            sched.step()
        assert bool(overflow) == (i in bad_steps) and ctl.last_skipped == (i in bad_steps)
        if i in bad_steps:
            assert_same(before, snapshot(net, opt, sched))
    assert ctl.skipped_steps == len(bad_steps) and ctl.steps == len(data)
    assert all(torch.isfinite(p).all() for p in net.parameters())

    # reference: the same run without loss scaling, in which the bad batches never happened
    ref = mlp()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=3, gamma=0.5)
    for i, (x, y) in enumerate(data):
        if i in bad_steps:
            continue
        ref_opt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        ref_sched.step()
    # power-of-two scales make scale -> backward -> unscale exact: bit-for-bit equal
    assert_same(snapshot(net, opt, sched), snapshot(ref, ref_opt, ref_sched))


def test_multiple_optimizers_one_update_per_step_and_whole_step_skipped():
    net = mlp()
    o1 = torch.optim.SGD(net[0].parameters(), lr=0.1)
    o2 = torch.optim.Adam(net[2].parameters(), lr=1e-2)
    ctl = LossScaleController(DynamicLossScaleManager(2**6, 2, 2))
    ref = SpecDeviceRule(2**6, 2, 2)
    inj = Injector(net[2].bias, float("inf"))  # only optimizer 2's gradients overflow
    for i, (x, y) in enumerate(batches(10)):
        inj.armed = i in (3, 4, 7)
        before = [p.detach().clone() for p in net.parameters()]
        o1.zero_grad()
        o2.zero_grad()
        ctl.scale_loss(nn.functional.cross_entropy(net(x), y)).backward()
        ctl.unscale_(o1)
        ctl.unscale_(o2)
        overflow = ctl.found_overflow([o1, o2])
        if not ctl.should_skip(overflow):
            o1.step()
            o2.step()
        ctl.update(overflow)
        assert overflow == inj.armed
        assert ctl.scale == ref(overflow)
        assert int(ctl._cell.cur_iter) == i + 2  # one update per step, not per optimizer
        unchanged = all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
        assert unchanged == inj.armed  # on overflow neither optimizer stepped
    assert ctl.skipped_steps == 3 and ctl.steps == 10


def test_found_overflow_checks_optimizer_that_was_not_unscaled():
    net = mlp()
    o1 = torch.optim.SGD(net[0].parameters(), lr=0.1)
    o2 = torch.optim.SGD(net[2].parameters(), lr=0.1)
    ctl = LossScaleController(FixedLossScaleManager(2.0))
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    net[2].weight.grad[0, 0] = NAN
    ctl.unscale_(o1)
    assert ctl.found_overflow([o1]) is False
    assert ctl.found_overflow([o1, o2]) is True


# -------------------------------------------------------------- real run with injected faults
@pytest.fixture(scope="module")
def mnist1d_data():
    data_mod = pytest.importorskip("mnist1d.data")
    d = data_mod.make_dataset(data_mod.get_dataset_args())
    return (
        torch.tensor(d["x"], dtype=torch.float32),
        torch.tensor(d["y"], dtype=torch.long),
        torch.tensor(d["x_test"], dtype=torch.float32),
        torch.tensor(d["y_test"], dtype=torch.long),
    )


def test_injected_nonfinite_gradients_on_mnist1d_never_reach_parameters(mnist1d_data):
    x, y, x_test, y_test = mnist1d_data
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: one thread is faster and steady on a busy machine
    try:
        torch.manual_seed(0)
        net = nn.Sequential(
            nn.Linear(40, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
        )
        opt = torch.optim.Adam(net.parameters(), lr=3e-3)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=800)
        ctl = LossScaleController(DynamicLossScaleManager(scale_window=50))
        layers = [net[0].weight, net[2].bias, net[4].weight]
        injectors = [Injector(p, v) for p, v in zip(layers, [NAN, float("inf"), -float("inf")])]
        rng = np.random.default_rng(0)
        g = torch.Generator().manual_seed(0)
        bad = 0
        for _epoch in range(20):
            perm = torch.randperm(len(x), generator=g)
            for b in range(0, len(x), 100):
                idx = perm[b : b + 100]
                inject = rng.random() < 0.05
                bad += inject
                which = rng.integers(len(injectors))
                for k, inj in enumerate(injectors):
                    inj.armed = inject and k == which
                opt.zero_grad()
                _, overflow, _ = ctl.step(opt, nn.functional.cross_entropy(net(x[idx]), y[idx]))
                assert bool(overflow) == inject
                if not ctl.last_skipped:
                    sched.step()
                norms = torch.stack(torch._foreach_norm(list(net.parameters())))
                assert bool(torch.isfinite(norms).all())  # never a non-finite parameter
        assert bad > 20 and ctl.skipped_steps == bad
        with torch.no_grad():
            acc = (net(x_test).argmax(1) == y_test).float().mean().item()
    finally:
        torch.set_num_threads(threads)
    print(f"MNIST-1D test accuracy with injected faults: {acc:.3f}")
    assert acc > 0.55, acc  # MNIST-1D MLP reference ~0.68


# ------------------------------------------------------------------------------------ guard
class FakeDiagnostics:
    def __init__(self, name):
        self.name = name

    def first_nonfinite(self):
        return self.name


def test_guard_fires_after_1000_consecutive_overflows_with_diagnostics():
    ctl = LossScaleController(DynamicLossScaleManager(), diagnostics=FakeDiagnostics("net.3.conv"))
    for _ in range(999):
        ctl.update(True)
    assert ctl.consecutive_overflows == 999 and ctl.scale == 1.0
    with pytest.raises(RuntimeError, match=r"1000 consecutive.*loss scale is 1\.0.*'net\.3\.conv'"):
        ctl.update(True)


def test_guard_resets_on_good_step_and_can_be_disabled():
    ctl = LossScaleController(FixedLossScaleManager(), max_consecutive_overflows=5)
    for _ in range(3):
        for _ in range(4):
            ctl.update(True)
        ctl.update(False)
    assert ctl.consecutive_overflows == 0 and ctl.skipped_steps == 12
    with pytest.raises(RuntimeError, match="loss scale is 128.0.*Enable overflow diagnostics"):
        for _ in range(5):
            ctl.update(True)
    free = LossScaleController(DynamicLossScaleManager(), max_consecutive_overflows=None)
    for _ in range(1500):
        free.update(True)


def test_guard_with_diagnostics_finding_nothing():
    ctl = LossScaleController(
        DynamicLossScaleManager(), max_consecutive_overflows=2, diagnostics=FakeDiagnostics(None)
    )
    ctl.update(True)
    with pytest.raises(RuntimeError, match="backward pass"):
        ctl.update(True)


# ------------------------------------------------------------------------------------ state
def _run(net, opt, sched, ctl, data, bad, start):
    record = []
    inj = net._inj
    for i, (x, y) in enumerate(data[start:], start=start):
        inj.armed = i in bad
        opt.zero_grad()
        loss, ovf, scale = ctl.step(opt, nn.functional.cross_entropy(net(x), y))
        if not ctl.last_skipped:
            sched.step()
        record.append((float(loss), bool(ovf), float(scale)))
    return record


def _fresh(window=3):
    net = mlp(seed=3)
    net._inj = Injector(net[0].weight)
    opt = torch.optim.Adam(net.parameters(), lr=5e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)
    ctl = LossScaleController(DynamicLossScaleManager(2**10, 2, window, hysteresis=2))
    return net, opt, sched, ctl


def test_state_dict_resume_reproduces_trajectory_bit_for_bit():
    data = batches(40, seed=9)
    bad = {2, 3, 4, 9, 15, 16, 19, 20, 21, 27, 33}
    net, opt, sched, ctl = _fresh()
    full = _run(net, opt, sched, ctl, data, bad, 0)
    final = [p.detach().clone() for p in net.parameters()]

    net, opt, sched, ctl = _fresh()
    first = _run(net, opt, sched, ctl, data[:20], bad, 0)
    ckpt = {
        "model": net.state_dict(),
        "opt": opt.state_dict(),
        "sched": sched.state_dict(),
        LossScaleController.STATE_KEY: ctl.state_dict(),
    }
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)  # plain values: safe to load

    net, opt, sched, ctl = _fresh()
    net.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    sched.load_state_dict(ckpt["sched"])
    ctl.load_state_dict(ckpt[LossScaleController.STATE_KEY])
    assert ctl.scale == full[20][2]  # the scale the uninterrupted run used for step 21
    second = _run(net, opt, sched, ctl, data, bad, 20)
    assert first + second == full
    assert all(torch.equal(a, b) for a, b in zip(final, net.parameters()))
    assert ctl.steps == 40 and ctl.skipped_steps == len(bad)


def test_state_dict_contents_and_errors():
    ctl = LossScaleController(DynamicLossScaleManager(2**4, 2, 2))
    for o in (False, False, True):
        ctl.update(o)
    s = ctl.state_dict()
    assert s["scale"] == 16.0 and s["skipped_steps"] == 1 and s["steps"] == 3
    assert s["update_cell"] == {"cur_iter": 4, "last_overflow_iter": 3, "hysteresis_left": 1}
    with pytest.raises(ValueError, match="missing keys"):
        ctl.load_state_dict({"scale": 2.0})
    with pytest.raises(TypeError, match="state"):
        ctl.load_state_dict([1])
    with pytest.raises(ValueError, match="'scale'"):
        ctl.load_state_dict({**s, "scale": -1.0})
    fixed = LossScaleController(FixedLossScaleManager(8.0))
    fixed.load_state_dict({**s, "scale": 4.0})
    assert fixed.scale == 8.0 and fixed.skipped_steps == 1  # a fixed scale is configuration


# --------------------------------------------------------------- Fixed(no drop) and loss_scale
class SelfScalingSGD(torch.optim.SGD):
    """SGD that divides gradients by its own ``loss_scale`` (as MindSpore's optimizers do)."""

    def __init__(self, params, lr, loss_scale=1.0):
        super().__init__(params, lr=lr)
        for g in self.param_groups:
            g["loss_scale"] = loss_scale
        self.defaults["loss_scale"] = loss_scale

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-g["lr"] / g["loss_scale"])


def _true_sgd_update(seed=0):
    net = mlp(seed)
    x, y = batches(1)[0]
    nn.functional.cross_entropy(net(x), y).backward()
    torch.optim.SGD(net.parameters(), lr=0.5).step()
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize("opt_scale", [1.0, 1024.0, 256.0])
def test_fixed_no_drop_with_and_without_optimizer_loss_scale(opt_scale):
    expected = _true_sgd_update()
    net = mlp(0)
    opt = SelfScalingSGD(net.parameters(), lr=0.5, loss_scale=opt_scale)
    ctl = LossScaleController(FixedLossScaleManager(1024.0, drop_overflow_update=False))
    x, y = batches(1)[0]
    ctl.step(opt, nn.functional.cross_entropy(net(x), y))
    for a, b in zip(expected, net.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_fixed_no_drop_never_skips():
    net = mlp(0)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ctl = LossScaleController(FixedLossScaleManager(128.0, False))
    assert not ctl.drop_overflow_update
    x, y = batches(1)[0]
    _, ovf, scale = ctl.step(opt, nn.functional.cross_entropy(net(x), y) * NAN)
    assert bool(ovf) and float(scale) == 128.0 and ctl.skipped_steps == 0 and not ctl.last_skipped
    assert torch.isnan(net[0].weight).all()  # MindSpore semantics: the step was applied


def test_fixed_drop_skips_and_keeps_scale():
    net = mlp(0)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ctl = LossScaleController(FixedLossScaleManager(128.0))
    before = [p.detach().clone() for p in net.parameters()]
    x, y = batches(1)[0]
    ctl.step(opt, nn.functional.cross_entropy(net(x), y) * NAN)
    assert ctl.last_skipped and ctl.scale == 128.0
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))


# ------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    "args,kwargs,exc,name",
    [
        (("dynamic",), {}, TypeError, "manager"),
        ((None,), dict(max_consecutive_overflows=0), ValueError, "max_consecutive_overflows"),
        ((None,), dict(max_consecutive_overflows=2.5), TypeError, "max_consecutive_overflows"),
        ((None,), dict(diagnostics=object()), TypeError, "diagnostics"),
    ],
)
def test_controller_bad_arguments(args, kwargs, exc, name):
    with pytest.raises(exc, match=name):
        LossScaleController(*args, **kwargs)
