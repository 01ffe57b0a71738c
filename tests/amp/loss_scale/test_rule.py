"""The dynamic loss-scale rule: one function serves the cell, the manager, the scaler, the groups.

Hypothesis draws rules (factor, window, hysteresis, floor, ceiling, backoff), initial scales and
overflow sequences; the host and tensor arithmetic of :func:`next_scale_state` must agree bit for
bit with a plain transcription of the rule, and so must every class that moves a dynamic scale.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_amp.amp.loss_scale.managers import DynamicLossScaleManager, DynamicLossScaleUpdateCell
from lit_amp.amp.loss_scale.rule import (
    HOST,
    HOST_FP32,
    TENSOR,
    DynamicScaleRule,
    f32,
    next_scale_state,
)
from lit_amp.amp.loss_scale.scalers import DynamicLossScaler
from lit_amp.boost.group_loss_scale import GROUP_RULE, GroupLossScaleManager

# the same examples on every run: a seeded probe, not a flaky one
probe = settings(max_examples=100, deadline=None, derandomize=True, database=None)

#: runs of clean steps (growth, up to the ceiling or float32's end) and bursts of overflows
#: (shrink, hysteresis, the floor)
patterns = st.lists(st.booleans(), min_size=1, max_size=200) | st.lists(
    st.sampled_from([False] * 9 + [True]), min_size=1, max_size=300)


@st.composite
def cases(draw, fp32: bool, hysteresis: bool = True, bounds: bool = True, backoff: bool = True):
    """``(rule, init, pattern)``; with ``fp32`` every constant is a float32 value."""
    cast = f32 if fp32 else float
    factor = cast(draw(st.sampled_from([2.0, 3.0, 1.1, 1.5, 4.0])
                       | st.floats(1.01, 16.0, allow_nan=False)))
    init = cast(draw(st.sampled_from([1.0, 7.0, 2.0**10, 2.0**24, 3.0e38])
                     | st.floats(1.0, 1e30, allow_nan=False)))
    lo = cast(draw(st.sampled_from([1.0, 0.25]) | st.floats(1e-3, 1.0, allow_nan=False)))
    hi = draw(st.none() | st.floats(1.0, 1e6).map(lambda k: cast(min(init * k, 3.0e38))))
    rule = DynamicScaleRule(
        factor=factor,
        window=draw(st.integers(1, 12)),
        hysteresis=draw(st.integers(1, 4)) if hysteresis else 1,
        min_scale=draw(st.sampled_from([lo, lo, None])) if bounds else 1.0,
        max_scale=hi if bounds else None,
        backoff=draw(st.sampled_from([None, cast(1 / factor)])) if backoff else None,
    )
    return rule, init, draw(patterns)


def reference(scale, counter, left, overflow, rule, rnd=float):
    """The rule as branches, on Python numbers; ``rnd`` rounds each product and quotient."""
    kept = scale
    if overflow:
        if left <= 1:
            kept = rnd(scale / rule.factor) if rule.backoff is None else rnd(scale * rule.backoff)
            if rule.min_scale is not None:
                kept = max(kept, rule.min_scale)
        else:
            left -= 1
    due = counter + 1 >= rule.window
    if due and not overflow:
        grown = rnd(kept * rule.factor)
        if rule.max_scale is not None:
            grown = min(grown, rule.max_scale)
        scale = grown if math.isfinite(grown) else kept
        left = rule.hysteresis
    else:
        scale = kept
    return scale, 0 if overflow or due else counter + 1, left


@probe
@given(cases(fp32=True))
def test_host_fp32_and_tensor_arithmetic_agree_with_the_rule_bit_for_bit(case):
    rule, init, pattern = case
    host = ref = (init, 0, rule.hysteresis)
    tensor = (torch.tensor(init), torch.tensor(0), torch.tensor(rule.hysteresis))
    for overflow in pattern:
        ref = reference(*ref, overflow, rule, rnd=f32)
        host = next_scale_state(*host, overflow, rule, HOST_FP32)
        tensor = next_scale_state(*tensor, torch.tensor(overflow), rule, TENSOR)
        assert host == ref
        assert (tensor[0].item(), int(tensor[1]), int(tensor[2])) == ref


@probe
@given(cases(fp32=False))
def test_host_arithmetic_is_python_numbers(case):
    rule, init, pattern = case
    state = ref = (init, 0, rule.hysteresis)
    for overflow in pattern:
        ref = reference(*ref, overflow, rule)
        state = next_scale_state(*state, overflow, rule, HOST)
        assert state == ref


def test_tensor_arithmetic_is_elementwise():
    """One call moves a vector of scales, each by its own overflow flag (the groups' use)."""
    rule = DynamicScaleRule(factor=2.0, window=2, hysteresis=2)
    scales = torch.tensor([8.0, 8.0, 8.0])
    counters, left = torch.tensor([1, 0, 1]), torch.tensor([1, 1, 2])
    out = next_scale_state(scales, counters, left, torch.tensor([False, True, True]), rule, TENSOR)
    assert out[0].tolist() == [16.0, 4.0, 8.0]  # grew, shrank, tolerated (hysteresis)
    assert out[1].tolist() == [0, 0, 0] and out[2].tolist() == [2, 1, 1]


# ----------------------------------------------------------------- every user moves by the rule
def cell_trajectory(cell, init, pattern, path):
    scale = torch.tensor(init, dtype=torch.float32)
    step = cell._forward_host if path == "host" else cell._forward_tensor
    out = []
    for overflow in pattern:
        step(scale, overflow if path == "host" else torch.tensor(overflow))
        out.append(scale.item())
    return out


@probe
@given(cases(fp32=True, backoff=False), st.sampled_from(["host", "tensor"]))
def test_update_cell_follows_the_rule(case, path):
    rule, init, pattern = case
    hi = rule.max_scale if rule.max_scale is None or rule.max_scale >= init else None
    lo = 1.0 if rule.min_scale is None else rule.min_scale  # the cell always has a floor
    rule = rule._replace(min_scale=lo, max_scale=hi)
    cell = DynamicLossScaleUpdateCell(init, rule.factor, rule.window, hysteresis=rule.hysteresis,
                                      min_loss_scale=lo, max_loss_scale=hi)
    state, expected = (init, 0, rule.hysteresis), []
    for overflow in pattern:
        state = reference(*state, overflow, rule, rnd=f32)
        expected.append(state[0])
    assert cell_trajectory(cell, init, pattern, path) == expected
    assert int(cell.hysteresis_left) == state[2]
    assert int(cell.cur_iter) - int(cell.last_overflow_iter) - 1 == state[1]


@probe
@given(cases(fp32=False, backoff=False))
def test_manager_host_mirror_follows_the_rule(case):
    rule, init, pattern = case
    hi = rule.max_scale if rule.max_scale is None or rule.max_scale >= init else None
    lo = min(1.0 if rule.min_scale is None else rule.min_scale, init)
    m = DynamicLossScaleManager(init, rule.factor, rule.window, hysteresis=rule.hysteresis,
                                min_loss_scale=lo, max_loss_scale=hi)
    # MindSpore's host manager multiplies by its decrease_ratio = 1 / factor
    rule = rule._replace(min_scale=lo, max_scale=hi, backoff=1 / rule.factor)
    state = (init, 0, rule.hysteresis)
    for overflow in pattern:
        state = reference(*state, overflow, rule)
        m.update_loss_scale(overflow)
        assert m.get_loss_scale() == state[0]


@probe
@given(st.integers(2, 8), st.integers(1, 12), st.integers(0, 100), patterns)
def test_functional_scaler_is_the_rule_without_hysteresis(factor, window, log2_init, pattern):
    init = 2.0**log2_init
    scaler = DynamicLossScaler(init, factor, window)
    rule = DynamicScaleRule(factor=float(factor), window=window)
    state = (init, 0, 1)
    for overflow in pattern:
        state = reference(*state, overflow, rule, rnd=f32)
        scaler.adjust(not overflow)
        assert (scaler.scale_value.item(), int(scaler.counter)) == state[:2]


def test_group_scales_follow_the_rule_per_group():
    m = GroupLossScaleManager([4.0, 64.0], [])
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]
    m.loss_scale_groups = [[params[0]], [params[1]]]
    cell = m.get_update_cell()
    rng = np.random.default_rng(0)
    # float32 tensors compute with the constants as float32 values
    rule = DynamicScaleRule(factor=f32(GROUP_RULE.factor), window=1, min_scale=None,
                            backoff=f32(GROUP_RULE.backoff))
    states = [(4.0, 0, 1), (64.0, 0, 1)]
    for _ in range(50):
        bad = rng.random(2) < 0.4
        for p, b in zip(params, bad):
            p.grad = torch.full_like(p, math.inf if b else 1.0)
        cell(torch.tensor(1.0), bool(bad.any()))
        states = [reference(*s, bool(b), rule, rnd=f32) for s, b in zip(states, bad)]
        assert m.loss_scales == [s[0] for s in states]
