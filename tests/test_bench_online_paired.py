"""``bench/online_paired.py``'s arithmetic: a drift of the machine hits the online and the bare
windows alike and leaves the ratio where it is; the cycles pair each online window with the
bare windows either side of it; the warm-up window is never counted."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import online_paired as paired  # noqa: E402


def _windows(speeds: list[float], share: float, seconds: float) -> list[dict]:
    return [{"seconds": seconds, "records": round(share * s * seconds)} for s in speeds]


def test_a_drifting_machine_leaves_the_ratio_unchanged():
    # the machine's speed falls by a third over the run; the loop always runs at 0.9 x
    speed = [60_000 * (1 - i / 30) for i in range(21)]
    on = _windows([(a + b) / 2 for a, b in zip(speed, speed[1:])], 0.9, 40.0)
    bare = _windows(speed[1:], 1.0, 20.0)
    assert all(math.isclose(r, 0.9, rel_tol=0.02) for r in paired.paired_ratios(on, bare))
    lo, hi = paired.bootstrap(on, bare)
    assert 0.87 < lo <= hi < 0.93


def test_each_online_window_is_paired_with_the_bare_windows_either_side():
    on = _windows([1.0, 9.0, 2.0, 3.0], 1.0, 10.0)  # window 0: the warm-up, left out
    bare = _windows([2.0, 4.0, 2.0, 6.0], 1.0, 10.0)
    assert paired.paired_ratios(on, bare) == pytest.approx([9 / 3, 2 / 3, 3 / 4])


def test_too_few_cycles_give_no_interval():
    on = _windows([1.0, 1.0], 1.0, 10.0)
    assert paired.bootstrap(on, _windows([1.0, 1.0], 1.0, 10.0)) == []


def test_the_bare_steps_fresh_batches_are_never_the_same_batch_twice():
    stream = ("criteo", 0.02)
    fresh = paired.online.FreshBatches(stream, 64, start=5)
    taken = fresh.take(3) + fresh.take(2)  # batches 5-7, then 8-9
    cats = [tuple(features["cat"].flatten().tolist()) for features, _ in taken]
    assert len(set(cats)) == 5  # five distinct batches, none repeated across takes
    # batch k of the stream, whichever take made it
    (eighth,) = paired.online.bare_batches(stream, 64, 1, start=8)
    assert torch.equal(taken[3][0]["cat"], eighth[0]["cat"])
    assert torch.equal(taken[3][1], eighth[1])
    # the recycled 100 start at batch 0: the fresh ones are not among them
    (zeroth,) = paired.online.bare_batches(stream, 64, 1)
    assert not torch.equal(taken[0][0]["cat"], zeroth[0]["cat"])


def test_the_pooled_ratio_keeps_every_runs_weight():
    import online_paired_pool as pool

    runs = [{"online_rates": [1, 90, 90, 90], "bare_rates": [100, 100, 100, 100]},
            {"online_rates": [1, 80, 80], "bare_rates": [100, 100, 100]}]
    r = pool.pooled(runs)
    assert r["ratio"] == pytest.approx((3 * 90 + 2 * 80) / 500)  # the warm-ups left out
    assert r["cycles"] == 5 and r["cycles_below_0.9"] == 2
    # each run's cycles are resampled within it: here every draw gives the same total
    assert r["ratio_interval_90"] == pytest.approx([r["ratio"]] * 2)
