"""Functional loss scalers (spec §2.5): StaticLossScaler, DynamicLossScaler, all_finite."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_amp.amp.loss_scale.scalers import (
    DynamicLossScaler,
    LossScaler,
    StaticLossScaler,
    all_finite,
    init_status,
)

INF, NAN = float("inf"), float("nan")


# ----------------------------------------------------------------------------- StaticLossScaler
def test_static_scale_unscale_tensor_and_tuple():
    s = StaticLossScaler(2**10)
    assert isinstance(s, LossScaler)
    assert s.scale_value.dtype == torch.float32
    assert torch.equal(s.scale(torch.tensor([1.0])), torch.tensor([1024.0]))
    grads = (
        torch.tensor([1.5, 1.0], dtype=torch.float16),
        torch.tensor([1.2], dtype=torch.float16),
    )
    out = s.unscale(grads)
    assert isinstance(out, tuple) and len(out) == 2
    assert all(o.dtype == torch.float16 for o in out)
    # MindSpore: grad * reciprocal(scale).astype(grad.dtype)
    expect = grads[0] * torch.tensor(1 / 1024, dtype=torch.float16)
    assert torch.equal(out[0], expect)
    lst = s.scale([torch.ones(2, dtype=torch.bfloat16), torch.ones(1)])
    assert isinstance(lst, list) and lst[0].dtype == torch.bfloat16
    assert torch.equal(lst[1], torch.tensor([1024.0]))


def test_static_keeps_input_dtype_and_does_not_modify_input():
    s = StaticLossScaler(3)
    x = torch.tensor([1.0, 2.0], dtype=torch.float64)
    y = s.scale(x)
    assert y.dtype == torch.float64 and torch.equal(
        x, torch.tensor([1.0, 2.0], dtype=torch.float64)
    )
    assert torch.equal(y, torch.tensor([3.0, 6.0], dtype=torch.float64))
    nested = s.scale((torch.ones(1), (torch.ones(1), [torch.ones(1)])))
    assert torch.equal(nested[1][1][0], torch.tensor([3.0]))


def test_static_adjust_returns_false_and_keeps_scale():
    s = StaticLossScaler(128.0)
    assert s.adjust(torch.tensor(False)) is False
    assert s.adjust(True) is False
    assert float(s.scale_value) == 128.0


@pytest.mark.parametrize("bad", [0.5, 0, -3, float("inf"), float("nan")])
def test_static_bad_value(bad):
    with pytest.raises(ValueError, match="scale_value"):
        StaticLossScaler(bad)


@pytest.mark.parametrize("bad", ["2", None, True, torch.tensor(2.0)])
def test_static_bad_type(bad):
    with pytest.raises(TypeError, match="scale_value"):
        StaticLossScaler(bad)


def test_scale_rejects_non_tensor_inputs():
    with pytest.raises(TypeError, match="inputs"):
        StaticLossScaler(2).scale(3.0)
    with pytest.raises(TypeError, match="inputs"):
        StaticLossScaler(2).unscale((torch.ones(1), "x"))


# ---------------------------------------------------------------------------- DynamicLossScaler
def _reference_adjust(scale: np.float32, counter: int, finite: bool, factor: int, window: int):
    """Spec §2.5, written independently with numpy fp32 arithmetic."""
    if finite:
        with np.errstate(over="ignore"):
            grown = np.float32(scale * np.float32(factor))
        if counter == window - 1 and np.isfinite(grown):
            scale = grown
        counter = (counter + 1) % window
    else:
        scale = max(np.float32(1.0), np.float32(scale / np.float32(factor)))
        counter = 0
    return np.float32(scale), counter


def test_dynamic_mindspore_doc_example():
    scaler = DynamicLossScaler(scale_value=2**10, scale_factor=2, scale_window=1)
    grads = (
        torch.tensor([NAN, 1.0], dtype=torch.float16),
        torch.tensor([0.2], dtype=torch.float16),
    )
    unscaled = scaler.unscale(grads)
    finite = all_finite(unscaled)
    assert finite.dtype == torch.bool and not bool(finite)
    assert scaler.adjust(finite) is True
    assert float(scaler.scale_value) == 512.0


@pytest.mark.parametrize("factor,window,init", [(2, 3, 2**10), (3, 2, 7.0), (2, 1, 1.0)])
def test_dynamic_adjust_trajectory_matches_spec(factor, window, init):
    rng = np.random.default_rng(0)
    pattern = rng.random(300) < 0.15
    pattern[[window - 1, 2 * window]] = True  # overflow exactly at a growth step
    scaler = DynamicLossScaler(init, factor, window)
    ref_s, ref_c = np.float32(init), 0
    for bad in pattern:
        assert scaler.adjust(torch.tensor(not bad)) is True
        ref_s, ref_c = _reference_adjust(ref_s, ref_c, not bad, factor, window)
        assert float(scaler.scale_value) == float(ref_s)
        assert int(scaler.counter) == ref_c
    assert scaler.counter.dtype == torch.int32 and scaler.scale_value.dtype == torch.float32


def test_dynamic_floor_is_one_and_python_bool_accepted():
    scaler = DynamicLossScaler(4, 2, 5)
    for _ in range(5):
        scaler.adjust(False)
    assert float(scaler.scale_value) == 1.0 and int(scaler.counter) == 0


def test_dynamic_growth_refused_when_not_finite():
    big = float(np.finfo(np.float32).max) / 1.5
    scaler = DynamicLossScaler(big, 2, 1)
    scaler.adjust(True)
    assert float(scaler.scale_value) == float(np.float32(big))  # big*2 is inf in fp32: kept


@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        (dict(scale_value=0.5, scale_factor=2, scale_window=10), ValueError, "scale_value"),
        (dict(scale_value="a", scale_factor=2, scale_window=10), TypeError, "scale_value"),
        (dict(scale_value=8, scale_factor=0, scale_window=10), ValueError, "scale_factor"),
        (dict(scale_value=8, scale_factor=2.0, scale_window=10), TypeError, "scale_factor"),
        (dict(scale_value=8, scale_factor=2, scale_window=0), ValueError, "scale_window"),
        (dict(scale_value=8, scale_factor=2, scale_window=1.5), TypeError, "scale_window"),
        (dict(scale_value=8, scale_factor=2, scale_window=True), TypeError, "scale_window"),
    ],
)
def test_dynamic_bad_arguments(kwargs, exc, name):
    with pytest.raises(exc, match=name):
        DynamicLossScaler(**kwargs)


@pytest.mark.parametrize("factor", [1, 0])
def test_scale_factor_must_exceed_one(factor):
    # a factor of 1 never moves the scale (MindSpore accepts it silently)
    with pytest.raises(ValueError, match=r"'scale_factor' must be an int >= 2"):
        DynamicLossScaler(scale_value=8, scale_factor=factor, scale_window=10)


def test_dynamic_state_dict_and_to():
    a = DynamicLossScaler(2**8, 2, 3)
    for f in (True, True, False, True):
        a.adjust(f)
    b = DynamicLossScaler(2**8, 2, 3)
    b.load_state_dict(a.state_dict())
    for f in (True, True, True, False, True):
        a.adjust(f)
        b.adjust(f)
        assert float(a.scale_value) == float(b.scale_value) and int(a.counter) == int(b.counter)
    assert b.to("cpu") is b
    with pytest.raises(ValueError, match="counter"):
        b.load_state_dict({"scale_value": torch.tensor(1.0)})


# ---------------------------------------------------------------------------------- all_finite
@pytest.mark.parametrize(
    "inputs,expected",
    [
        (torch.tensor([1.0, 2.0]), True),
        (torch.tensor([1.0, INF]), False),
        (torch.tensor([-INF]), False),
        ((torch.tensor([1.0]), torch.tensor([NAN, 1.0])), False),
        ([torch.tensor([1.0]), torch.tensor([2.0])], True),
        ((), True),
        ((torch.tensor([1e30, -1e30] * 1000),), True),  # L2 norm overflows, values finite
        (
            (torch.tensor([1e30], dtype=torch.bfloat16), torch.tensor([6e4], dtype=torch.float16)),
            True,
        ),
        ((torch.tensor([1e30, NAN]),), False),
        ((torch.tensor([1, 2]), torch.tensor([True])), True),
        ((torch.zeros(0),), True),
        ((torch.ones(3, dtype=torch.float16), (torch.tensor([INF], dtype=torch.bfloat16),)), False),
    ],
)
def test_all_finite(inputs, expected):
    out = all_finite(inputs)
    assert out.dtype == torch.bool and out.dim() == 0
    assert bool(out) is expected


def test_all_finite_large_tensors_and_readonly():
    g = [torch.randn(1000, 100), torch.randn(10)]
    before = [x.clone() for x in g]
    assert bool(all_finite(g))
    g[0][123, 45] = NAN
    assert not bool(all_finite(g))
    g[0][123, 45] = 3.0e38
    assert bool(all_finite(g))
    assert all(torch.equal(a, b) for a, b in zip(before[1:], g[1:]))


def test_all_finite_sparse_and_status_compat():
    sp = torch.sparse_coo_tensor([[0, 2]], [1.0, INF], (4,), check_invariants=True)
    assert not bool(all_finite((sp,), init_status()))
    assert init_status().shape == (8,)
    with pytest.raises(TypeError, match="inputs"):
        all_finite([torch.ones(1), 1.0])


def test_raw_loop_with_functional_scaler():
    """The usage pattern of mindspore.amp: scale -> grad -> unscale -> all_finite -> adjust."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    scaler = DynamicLossScaler(2**12, 2, 5)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    first = None
    for step in range(40):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        first = first if first is not None else float(loss.detach())
        scaler.scale(loss).backward()
        grads = scaler.unscale(tuple(p.grad for p in net.parameters()))
        if step == 7:
            grads = (grads[0] * NAN, grads[1])
        finite = all_finite(grads)
        if finite:
            for p, g in zip(net.parameters(), grads):
                p.grad = g
            opt.step()
        scaler.adjust(finite)
    assert float(loss.detach()) < first
    assert all(torch.isfinite(p).all() for p in net.parameters())
