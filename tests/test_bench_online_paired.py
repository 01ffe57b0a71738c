"""``bench/online/paired.py``'s arithmetic: a drift of the machine hits the online and the bare
windows alike and leaves the ratio where it is; the cycles pair each online window with the
bare windows either side of it; the warm-up window is never counted."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.online import paired, pool, workload  # noqa: E402


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
    fresh = workload.FreshBatches(stream, 64, start=5)
    taken = fresh.take(3) + fresh.take(2)  # batches 5-7, then 8-9
    cats = [tuple(features["cat"].flatten().tolist()) for features, _ in taken]
    assert len(set(cats)) == 5  # five distinct batches, none repeated across takes
    # batch k of the stream, whichever take made it
    (eighth,) = workload.bare_batches(stream, 64, 1, start=8)
    assert torch.equal(taken[3][0]["cat"], eighth[0]["cat"])
    assert torch.equal(taken[3][1], eighth[1])
    # the recycled 100 start at batch 0: the fresh ones are not among them
    (zeroth,) = workload.bare_batches(stream, 64, 1)
    assert not torch.equal(taken[0][0]["cat"], zeroth[0]["cat"])


def test_the_pooled_ratio_keeps_every_runs_weight():
    runs = [{"online_rates": [1, 90, 90, 90], "bare_rates": [100, 100, 100, 100]},
            {"online_rates": [1, 80, 80], "bare_rates": [100, 100, 100]}]
    r = pool.pooled(runs)
    assert r["ratio"] == pytest.approx((3 * 90 + 2 * 80) / 500)  # the warm-ups left out
    assert r["cycles"] == 5 and r["cycles_below_0.9"] == 2
    # each run's cycles are resampled within it: here every draw gives the same total
    assert r["ratio_interval_90"] == pytest.approx([r["ratio"]] * 2)


def test_a_held_snapshot_write_stops_between_chunks_and_ends_whole_after_resume(
        tmp_path, monkeypatch):
    # the bench holds a checkpoint write through a bare window: it must stop writing there
    # (or its cost would land on the bare side) and still end with the state at take
    import concurrent.futures
    import threading
    import time

    from lit_amp.rec import LazyAdam
    from lit_amp.rec.state import snapshot as snapshot_mod
    from lit_amp.rec.state.snapshot import Snapshots

    monkeypatch.setattr(snapshot_mod, "CHUNK_BYTES", 4096)
    chunks, first = [], threading.Event()
    as_bytes = snapshot_mod.as_bytes

    def counted(t):
        chunks.append(time.monotonic())
        first.set()
        time.sleep(0.002)
        return as_bytes(t)

    monkeypatch.setattr(snapshot_mod, "as_bytes", counted)
    torch.manual_seed(0)
    emb = torch.nn.Embedding(20_000, 8, sparse=True)
    opt = LazyAdam(emb.parameters(), lr=0.1)
    emb(torch.tensor([1, 2])).sum().backward()
    opt.step()
    snaps = Snapshots([opt], min_protected_bytes=10_000)
    state = {"state_dict": emb.state_dict()}
    expected = {k: v.clone() for k, v in state["state_dict"].items()}
    snap = snaps.take(state)
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lit_amp-test")
    other = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lit_amp-other")
    with paired.BackgroundTasks() as tasks:
        # as the checkpointer submits its writes: (the snapshot, the path)
        write = pool.submit(lambda s, p: s.write(p), snap, tmp_path / "a.ckpt")
        assert first.wait(30)
        deleted = other.submit(time.sleep, 0.2)  # a task that writes no snapshot: waited for
        waited, held = tasks.hold()
        assert deleted.done() and waited >= 0.15 and len(held) == 1
        n = len(chunks)
        time.sleep(0.3)
        assert len(chunks) <= n + 1 and not write.done()  # at most the chunk under way
        tasks.resume(held)
        write.result(timeout=60)
        assert len(chunks) > n + 10  # the rest was written after the resume
        assert tasks.wait() < 1.0
    pool.shutdown()
    other.shutdown()
    got = torch.load(tmp_path / "a.ckpt", weights_only=True)["state_dict"]
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    snaps.remove()
