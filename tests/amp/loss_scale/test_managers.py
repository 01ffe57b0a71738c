"""Loss-scale managers and update cells (spec §2.6)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_amp.amp.loss_scale.managers import (
    DynamicLossScaleManager,
    DynamicLossScaleUpdateCell,
    FixedLossScaleManager,
    FixedLossScaleUpdateCell,
    LossScaleManager,
)


class SpecDeviceRule:
    """Spec §2.6 ``DynamicLossScaleUpdateCell.construct``, transcribed step by step (fp32)."""

    def __init__(self, ls: float, factor: float, window: int) -> None:
        self.ls = np.float32(ls)
        self.factor = np.float32(factor)
        self.window = window
        self.cur_iter = 1
        self.last_overflow_iter = 0

    def __call__(self, overflow: bool) -> float:
        ls_ovf = max(np.float32(self.ls / self.factor), np.float32(1.0)) if overflow else self.ls
        should_inc = (self.cur_iter - self.last_overflow_iter) >= self.window
        if overflow or should_inc:
            self.last_overflow_iter = self.cur_iter
        if should_inc and not overflow:
            with np.errstate(over="ignore"):
                grown = np.float32(ls_ovf * self.factor)
            # lit_amp's one documented deviation: a growth to inf (beyond fp32 max) is refused
            self.ls = grown if np.isfinite(grown) else ls_ovf
        else:
            self.ls = ls_ovf
        self.cur_iter += 1
        return float(self.ls)


class SpecHostRule:
    """Spec §2.6 ``DynamicLossScaleManager.update_loss_scale`` transcribed (Python floats)."""

    def __init__(self, ls: float, factor: float, window: int) -> None:
        self.ls, self.factor, self.window = ls, factor, window
        self.cur_iter, self.last_overflow_iter, self.bad_step = 1, 0, 0

    def __call__(self, overflow: bool) -> float:
        if overflow:
            # the spec writes scale/factor; MindSpore's source multiplies by 1/factor
            self.ls = max(self.ls * (1 / self.factor), 1)
            self.last_overflow_iter = self.cur_iter
            self.bad_step += 1
        else:
            if (self.cur_iter - self.last_overflow_iter) % self.window == 0:
                self.ls *= self.factor
            self.bad_step = 0
        if self.bad_step > 1000:
            raise RuntimeError("overflow")
        self.cur_iter += 1
        return self.ls


def scripted_pattern(window: int, n: int = 400, seed: int = 0) -> list[bool]:
    """Random overflows + long clean runs + an overflow exactly at a growth step."""
    rng = np.random.default_rng(seed)
    pat = list(rng.random(n) < 0.1)
    pat[: window + 5] = [False] * (window + 5)
    pat[window - 1] = False
    pat[2 * window - 1] = True  # step 2*window is the 2nd growth step: overflow there
    pat[3 * window + 10 : 3 * window + 16] = [True] * 6  # a burst down towards the floor
    return pat


PATHS = ["host", "tensor"]  # the CPU fast path and the device-side tensor-op path


def run_cell(cell, init: float, pattern, path: str = "auto"):
    scale = torch.tensor(init, dtype=torch.float32)
    call = {"auto": cell, "host": cell._forward_host, "tensor": cell._forward_tensor}[path]
    out = []
    for ovf in pattern:
        ret = call(scale, torch.tensor(ovf) if path != "host" else ovf)
        assert ret.dtype == torch.bool and bool(ret) == ovf
        out.append(float(scale))
    return out


# ------------------------------------------------------------------------------ device-side rule
@pytest.mark.parametrize(
    "init,factor,window", [(2**24, 2, 2000), (2**10, 2, 5), (7.0, 3, 3), (2.0, 2, 1)]
)
@pytest.mark.parametrize("path", PATHS)
def test_dynamic_cell_matches_spec(init, factor, window, path):
    pattern = scripted_pattern(window, n=max(400, 4 * window + 50))
    ref = SpecDeviceRule(init, factor, window)
    expected = [ref(o) for o in pattern]
    cell = DynamicLossScaleUpdateCell(init, factor, window)
    assert run_cell(cell, init, pattern, path) == expected
    assert (
        int(cell.cur_iter) == ref.cur_iter
        and int(cell.last_overflow_iter) == ref.last_overflow_iter
    )


@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(hysteresis=3, min_loss_scale=0.3, max_loss_scale=1e6)],
)
def test_host_and_tensor_paths_agree_bitwise(kwargs):
    pattern = scripted_pattern(3, n=400, seed=11)
    a = DynamicLossScaleUpdateCell(1000.0, 1.1, 3, **kwargs)
    b = DynamicLossScaleUpdateCell(1000.0, 1.1, 3, **kwargs)
    assert run_cell(a, 1000.0, pattern, "host") == run_cell(b, 1000.0, pattern, "tensor")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_dynamic_cell_first_growth_at_window_and_overflow_at_growth_step():
    cell = DynamicLossScaleUpdateCell(16.0, 2, 3)
    traj = run_cell(cell, 16.0, [False, False, False, False, False, True, False, False, False])
    # growth after steps 3; step 6 would grow again but overflows -> halves and restarts window
    assert traj == [16, 16, 32, 32, 32, 16, 16, 16, 32]


@pytest.mark.parametrize("path", PATHS)
def test_dynamic_cell_floor_and_counters(path):
    cell = DynamicLossScaleUpdateCell(4.0, 2, 10)
    traj = run_cell(cell, 4.0, [True] * 5, path)
    assert traj == [2.0, 1.0, 1.0, 1.0, 1.0]
    assert int(cell.cur_iter) == 6 and int(cell.last_overflow_iter) == 5
    assert cell.get_loss_scale() == 4.0  # the initial value, as in MindSpore


def test_dynamic_cell_python_bool_and_shape_one():
    cell = DynamicLossScaleUpdateCell(8.0, 2, 1)
    scale = torch.tensor([8.0])
    cell(scale, False)
    cell(scale, True)
    assert scale.shape == (1,) and float(scale) == 8.0


@pytest.mark.parametrize("path", PATHS)
def test_dynamic_cell_refuses_non_finite_growth(path):
    big = float(np.finfo(np.float32).max)
    cell = DynamicLossScaleUpdateCell(big, 2, 1)
    assert run_cell(cell, big, [False, False], path) == [big, big]


def test_fixed_cell():
    cell = FixedLossScaleUpdateCell(128.0)
    scale = torch.tensor(128.0)
    assert bool(cell(scale, True)) and not bool(cell(scale, False))
    assert float(scale) == 128.0 and cell.get_loss_scale() == 128.0


# ------------------------------------------------------------------------- hysteresis and clamps
class RefExtended:
    """DeepSpeed-style hysteresis + apex-style clamps on top of MindSpore's rule (plain Python)."""

    def __init__(self, ls, factor, window, hysteresis, lo, hi):
        self.ls, self.f, self.w, self.h, self.lo, self.hi = ls, factor, window, hysteresis, lo, hi
        self.left, self.cur, self.last = hysteresis, 1, 0

    def __call__(self, overflow):
        if overflow:
            if self.left <= 1:
                self.ls = max(self.ls / self.f, self.lo)
            else:
                self.left -= 1
        inc = self.cur - self.last >= self.w
        if overflow or inc:
            self.last = self.cur
        if inc and not overflow:
            self.ls = self.ls * self.f if self.hi is None else min(self.ls * self.f, self.hi)
            self.left = self.h
        self.cur += 1
        return self.ls


@pytest.mark.parametrize("hysteresis,lo,hi", [(2, 1.0, None), (3, 4.0, 2.0**12), (1, 0.25, 2.0**9)])
@pytest.mark.parametrize("path", PATHS)
def test_cell_hysteresis_and_clamps(hysteresis, lo, hi, path):
    pattern = scripted_pattern(4, n=300, seed=3)
    init = 2.0**8
    ref = RefExtended(init, 2, 4, hysteresis, lo, hi)
    expected = [ref(o) for o in pattern]
    cell = DynamicLossScaleUpdateCell(
        init, 2, 4, hysteresis=hysteresis, min_loss_scale=lo, max_loss_scale=hi
    )
    assert run_cell(cell, init, pattern, path) == expected
    assert min(expected) >= lo and (hi is None or max(expected) <= hi)


def test_hysteresis_tolerates_then_shrinks():
    cell = DynamicLossScaleUpdateCell(64.0, 2, 100, hysteresis=2)
    # 1st overflow tolerated (scale kept), 2nd shrinks, 3rd shrinks again (allowance used up)
    assert run_cell(cell, 64.0, [True, True, True]) == [64.0, 32.0, 16.0]


# ----------------------------------------------------------------------------------- managers
def test_fixed_manager_defaults_and_cells():
    m = FixedLossScaleManager()
    assert isinstance(m, LossScaleManager)
    assert m.get_loss_scale() == 128.0 and m.get_drop_overflow_update() is True
    assert isinstance(m.get_update_cell(), FixedLossScaleUpdateCell)
    assert m.update_loss_scale(True) is None and m.get_loss_scale() == 128.0
    nodrop = FixedLossScaleManager(1024, False)
    assert nodrop.get_update_cell() is None and nodrop.get_drop_overflow_update() is False


def test_dynamic_manager_defaults_and_cell():
    m = DynamicLossScaleManager()
    assert m.get_loss_scale() == 2**24 and m.scale_factor == 2 and m.scale_window == 2000
    assert m.get_drop_overflow_update() is True
    cell = m.get_update_cell()
    assert isinstance(cell, DynamicLossScaleUpdateCell)
    assert (cell.loss_scale_value, cell.scale_factor, cell.scale_window) == (2**24, 2, 2000)
    assert (cell.hysteresis, cell.min_loss_scale, cell.max_loss_scale) == (1, 1.0, None)
    assert m.get_update_cell() is not cell  # a new cell per call, as MindSpore


@pytest.mark.parametrize("init,factor,window", [(2**24, 2, 2000), (2**10, 2, 5), (7.0, 3, 3)])
def test_host_mirror_matches_spec(init, factor, window):
    pattern = scripted_pattern(window, n=max(400, 4 * window + 50))
    ref = SpecHostRule(init, factor, window)
    m = DynamicLossScaleManager(init, factor, window)
    for o in pattern:
        expected = ref(o)
        m.update_loss_scale(o)
        assert m.get_loss_scale() == pytest.approx(expected, rel=0, abs=0)


def test_host_mirror_agrees_with_cell_for_power_of_two_factor():
    pattern = scripted_pattern(6, n=500, seed=7)
    m = DynamicLossScaleManager(2**12, 2, 6)
    traj = run_cell(m.get_update_cell(), 2**12, pattern)
    host = []
    for o in pattern:
        m.update_loss_scale(o)
        host.append(float(m.get_loss_scale()))
    assert host == traj


def test_host_mirror_raises_after_1000_consecutive_overflows():
    m = DynamicLossScaleManager(2**4, 2, 10)
    for _ in range(1000):
        m.update_loss_scale(True)  # bad_step == 1000 is still allowed (bad_step > 1000 raises)
    assert m.get_loss_scale() == 1
    with pytest.raises(RuntimeError, match="1001 consecutive"):
        m.update_loss_scale(True)


def test_host_mirror_good_step_resets_bad_steps():
    m = DynamicLossScaleManager(2**4, 2, 10)
    for _ in range(3):
        for _ in range(900):
            m.update_loss_scale(True)
        m.update_loss_scale(False)
    assert m.bad_step == 0


def test_host_mirror_hysteresis_and_clamps():
    m = DynamicLossScaleManager(64.0, 2, 2, hysteresis=2, min_loss_scale=16.0, max_loss_scale=128.0)
    seq = []
    for o in [True, True, True, True, False, False, False, False, False, False]:
        m.update_loss_scale(o)
        seq.append(m.get_loss_scale())
    assert seq == [64, 32, 16, 16, 16, 32, 32, 64, 64, 128]


def test_get_update_cell_starts_from_current_host_scale():
    m = DynamicLossScaleManager(2**10, 2, 5)
    m.update_loss_scale(True)
    assert m.get_update_cell().get_loss_scale() == 2**9


# ----------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        (dict(loss_scale=0.5), ValueError, "loss_scale"),
        (dict(loss_scale=float("inf")), ValueError, "loss_scale"),
        (dict(loss_scale="128"), TypeError, "loss_scale"),
        (dict(loss_scale=True), TypeError, "loss_scale"),
        (dict(drop_overflow_update=1), TypeError, "drop_overflow_update"),
    ],
)
def test_fixed_manager_bad_arguments(kwargs, exc, name):
    with pytest.raises(exc, match=name):
        FixedLossScaleManager(**kwargs)


@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        (dict(init_loss_scale=0.5), ValueError, "init_loss_scale"),
        (dict(init_loss_scale=None), TypeError, "init_loss_scale"),
        (dict(scale_factor=0), ValueError, "scale_factor"),
        (dict(scale_factor=-2), ValueError, "scale_factor"),
        (dict(scale_factor="2"), TypeError, "scale_factor"),
        (dict(scale_window=0), ValueError, "scale_window"),
        (dict(scale_window=2.5), TypeError, "scale_window"),
        (dict(hysteresis=0), ValueError, "hysteresis"),
        (dict(hysteresis=1.0), TypeError, "hysteresis"),
        (dict(min_loss_scale=0), ValueError, "min_loss_scale"),
        (dict(init_loss_scale=8, min_loss_scale=16), ValueError, "min_loss_scale"),
        (dict(init_loss_scale=8, max_loss_scale=4), ValueError, "max_loss_scale"),
        (dict(max_loss_scale="big"), TypeError, "max_loss_scale"),
    ],
)
def test_dynamic_manager_bad_arguments(kwargs, exc, name):
    with pytest.raises(exc, match=name):
        DynamicLossScaleManager(**kwargs)


def test_error_message_names_value_and_allowed():
    with pytest.raises(ValueError, match=r"'init_loss_scale' must be a finite number >= 1.*0\.5"):
        DynamicLossScaleManager(init_loss_scale=0.5)


@pytest.mark.parametrize("factor", [0.5, 1, 1.0])
def test_scale_factor_must_exceed_one(factor):
    # MindSpore accepts 0.5 silently: the scale then grows on overflow and shrinks when stable
    with pytest.raises(ValueError, match=r"'scale_factor' must be a finite number > 1\.0"):
        DynamicLossScaleManager(2.0**8, factor, 10)
    with pytest.raises(ValueError, match="'scale_factor'"):
        DynamicLossScaleUpdateCell(2.0**8, factor, 10)


def test_dynamic_manager_accepts_mindspore_values():
    DynamicLossScaleManager(1, 1.5, 1)  # any factor > 1, and init == 1
    DynamicLossScaleManager(init_loss_scale=2.0**15, max_loss_scale=2.0**15, min_loss_scale=2.0**15)


@pytest.mark.parametrize(
    "args,kwargs,name",
    [
        ((0.0, 2, 10), {}, "loss_scale_value"),
        ((8.0, 0, 10), {}, "scale_factor"),
        ((8.0, 2, 0), {}, "scale_window"),
        ((8.0, 2, 10), dict(hysteresis=0), "hysteresis"),
        ((8.0, 2, 10), dict(min_loss_scale=-1), "min_loss_scale"),
        ((8.0, 2, 10), dict(max_loss_scale=0.5), "max_loss_scale"),
    ],
)
def test_dynamic_cell_bad_arguments(args, kwargs, name):
    with pytest.raises(ValueError, match=name):
        DynamicLossScaleUpdateCell(*args, **kwargs)


def test_abstract_manager():
    with pytest.raises(TypeError):
        LossScaleManager()
