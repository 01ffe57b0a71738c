"""The scale axis's runs, each in a fresh process (its own peak RSS): one size (bare step,
throughput, freshness), the memory soak, and the background-checkpoint check."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bench.online.workload import (
    RssSampler,
    _checkpoint_summary,
    _publish_summary,
    _thin,
    bare_step,
    fault_in,
    make_stream,
    rss_bytes,
    run_baseline,
    run_online,
    scale_model,
    state_bytes,
)
from lit_amp.rec import (
    RecModel,
)
from lit_amp.rec.sources import SyntheticClickSource


def run_size(vocab: int, o: dict) -> dict:
    """One size of the scale axis, in this (fresh) process: bare step, throughput,
    freshness."""
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(o["threads"])
    sampler = RssSampler(0.25)
    t0 = time.monotonic()
    net, opt = scale_model(vocab, o["optimizer"], o["collisionless"], o["amp"])
    init_s = time.monotonic() - t0
    stream = ("criteo", o["new_frac"])
    fault_in(net, opt, o["batch"], stream)
    print(f"[{vocab:,}] bare step for {o['bare_seconds']:.0f} s ...", flush=True)
    before = bare_step(o, net, opt, stream)
    sizes = state_bytes(net, opt)
    model = RecModel(net, nn.BCEWithLogitsLoss(), opt)
    root = Path(tempfile.mkdtemp(prefix="lit_amp_bench_scale_"))
    common = {"seconds": o["seconds"], "batch": o["batch"], "warmup": min(10.0, o["seconds"] / 4),
              "publish_every": o["publish_every"], "model": model, "stream": stream,
              "ckpt_every": o["ckpt_every"], "delete_consumed": True,
              "full_every": o["full_every"],
              "publish": {} if o["full_publishes"] else {"delta": True}}
    try:
        print(f"[{vocab:,}] throughput for {o['seconds']:.0f} s ...", flush=True)
        thr = run_online(root / "throughput", rate=0.0, **common)
        shutil.rmtree(root / "throughput", ignore_errors=True)
        # right after the throughput phase: this machine's speed drifts over minutes
        print(f"[{vocab:,}] bare step again for {o['bare_seconds']:.0f} s ...", flush=True)
        after = bare_step(o, net, opt, stream)
        rate = o["rate"] or min(o["rate_cap"], o["rate_fraction"] * thr["sustained_records_per_s"])
        rate = max(rate, float(o["batch"]))
        print(f"[{vocab:,}] freshness for {o['seconds']:.0f} s at {rate:,.0f} records/s ...",
              flush=True)
        fr = run_online(root / "freshness", rate=rate, **common)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    # the ratio is taken to the faster of the two: a slow window never flatters it
    base = max(before, after, key=lambda b: b["records_per_s"])
    base = {**base, "before_records_per_s": before["records_per_s"],
            "after_records_per_s": after["records_per_s"]}
    rss = sampler.stop()
    peak = rss_bytes("VmHWM")
    state = sizes["param_bytes"] + sizes["optimizer_bytes"]
    return {
        "vocab": vocab, "rows": 26 * vocab, **sizes, "init_s": init_s, "bare": base,
        "throughput": thr, "freshness": fr,
        "ratio_to_bare": thr["sustained_records_per_s"] / base["records_per_s"],
        "peak_rss_bytes": peak, "rss_over_state": peak / state,
        "rss_samples": _thin(rss),
        "checkpoint": _checkpoint_summary([thr, fr]),
        "publish": _publish_summary(thr, o["publish_every"]),
    }


def run_soak(vocab: int, o: dict) -> dict:
    """``soak_minutes`` of online training at ``vocab`` rows per feature on ever new ids,
    RSS sampled every second."""
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(o["threads"])
    sampler = RssSampler(1.0)
    net, opt = scale_model(vocab, o["optimizer"], o["collisionless"], o["amp"])
    stream = ("criteo", o["soak_new_frac"])
    run_baseline(2.0, o["batch"], net, opt, stream, n_batches=4)  # the optimizer state exists
    sizes = state_bytes(net, opt)
    model = RecModel(net, nn.BCEWithLogitsLoss(), opt)
    root = Path(tempfile.mkdtemp(prefix="lit_amp_bench_soak_"))
    seconds = 60.0 * o["soak_minutes"]
    print(f"[soak {vocab:,}] {seconds:.0f} s at {o['soak_rate']:,.0f} records/s, "
          f"{o['soak_new_frac']:.0%} new ids ...", flush=True)
    try:
        run = run_online(root / "soak", seconds=seconds, batch=o["batch"],
                         rate=o["soak_rate"], publish_every=o["publish_every"], warmup=10.0,
                         model=model, stream=stream, ckpt_every=max(60.0, o["ckpt_every"]),
                         full_every=o["full_every"],
                         publish={} if o["full_publishes"] else {"delta": True},
                         delete_consumed=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rss = sampler.stop()
    state = sizes["param_bytes"] + sizes["optimizer_bytes"]
    half = [(t, b) for t, b in rss if t >= rss[-1][0] / 2] if rss else []
    slope = float(np.polyfit([t for t, _ in half], [b for _, b in half], 1)[0]) * 60 \
        if len(half) > 2 else None
    emb = net.embedding
    return {
        "vocab": vocab, "rows": 26 * vocab, **sizes, "seconds": seconds,
        "records_trained": run["records_trained"],
        "distinct_new_ids_seen": int(run["records_trained"] * 26 * o["soak_new_frac"]),
        "peak_rss_bytes": rss_bytes("VmHWM"), "budget_bytes": 1.5 * state,
        "rss_over_state": rss_bytes("VmHWM") / state,
        "rss_slope_bytes_per_min_last_half": slope,
        "rss_samples": _thin(rss),
        "evictions": int(getattr(emb, "evictions", 0)), "overflows": int(getattr(emb, "overflows",
                                                                                 0)),
        "checkpoint": _checkpoint_summary([run]),
        "publish": _publish_summary(run, o["publish_every"]),
        "sustained_records_per_s": run["sustained_records_per_s"],
        "backlog_end_records": run["backlog_end_records"],
    }


def _crc(t: torch.Tensor) -> int:
    b = t.detach().contiguous().reshape(-1).view(torch.uint8)
    c = 0
    for at in range(0, len(b), 1 << 26):
        c = zlib.crc32(memoryview(b[at:at + (1 << 26)].numpy()), c)
    return c


def _crcs(payload: dict) -> dict:
    """CRC32 of the bytes of every tensor of a ``{"state_dict", "optimizer_states"}`` dict."""
    out = {k: _crc(v) for k, v in payload["state_dict"].items()}
    for i, st in payload["optimizer_states"][0]["state"].items():
        out.update({f"optimizer.{i}.{k}": _crc(v) for k, v in st.items() if torch.is_tensor(v)})
    return out


def run_ckpt_check(vocab: int, o: dict) -> dict:
    """One background checkpoint at ``vocab`` rows per feature, in this process, with training
    going on (no producer, no Lightning): the loop's stall, the write, the rows copied on
    write, training speed during the write, peak RSS; then the same dict written by the loop
    (``torch.save``, as every checkpoint was before); then the file checked byte for byte
    (CRC32 per tensor) against the state at the snapshot."""
    from lit_amp.rec.state.snapshot import Snapshots

    torch.set_num_threads(o["threads"])
    net, opt = scale_model(vocab, o["optimizer"], o["collisionless"], o["amp"])
    stream = ("criteo", o["new_frac"])
    gen, schema = make_stream(stream, o["batch"]), SyntheticClickSource(batch_size=1000).schema
    batches = [schema.to_batch(gen.columns(i)) for i in range(100)]
    loss = nn.BCEWithLogitsLoss()

    def step(i: int) -> None:
        features, label = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss(net(features), label).backward()
        opt.step()

    def steps_while(cond: Any) -> tuple[float, float]:
        t0, n, worst = time.monotonic(), 0, 0.0
        while cond(t0):
            s0 = time.perf_counter()
            step(n)
            n, worst = n + 1, max(worst, time.perf_counter() - s0)
        return n * o["batch"] / (time.monotonic() - t0), worst

    bare, _ = steps_while(lambda t0: time.monotonic() - t0 < o["bare_seconds"])
    sizes = state_bytes(net, opt)
    workdir = Path(tempfile.mkdtemp(prefix="lit_amp_bench_ckpt_"))
    path = workdir / "online.ckpt"
    try:
        snaps = Snapshots([opt])
        t0 = time.perf_counter()
        payload = {"state_dict": net.state_dict(), "optimizer_states": [opt.state_dict()]}
        snap = snaps.take(payload)
        stall = time.perf_counter() - t0
        expected = _crcs(payload)  # nothing has stepped since the snapshot
        done: dict = {}

        def write() -> None:
            c0 = time.thread_time()
            done["stats"] = snap.write(path)
            done["cpu"] = time.thread_time() - c0

        writer = threading.Thread(target=write)
        writer.start()
        during, worst = steps_while(lambda t0: writer.is_alive())
        writer.join()
        peak = rss_bytes("VmHWM")
        t0 = time.perf_counter()
        torch.save(payload, workdir / "in_loop.ckpt")
        in_loop = time.perf_counter() - t0
        os.remove(workdir / "in_loop.ckpt")
        got = _crcs(torch.load(path, mmap=True, weights_only=True))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    st = done["stats"]
    state = sizes["param_bytes"] + sizes["optimizer_bytes"]
    return {
        "vocab": vocab, "rows": 26 * vocab, **sizes, "bare_records_per_s": bare,
        "stall_s": stall, "write_s": st.write_s, "writer_cpu_s": done["cpu"], "bytes": st.bytes,
        "cow_rows": st.cow_rows, "cow_bytes": st.cow_bytes,
        "records_per_s_during_write": during, "worst_step_s_during_write": worst,
        "in_loop_write_s": in_loop, "peak_rss_bytes": peak, "rss_over_state": peak / state,
        "tensors_checked": len(expected),
        "tensors_differing": sorted(k for k in expected if got.get(k) != expected[k]),
        "loadavg": os.getloadavg(),
    }


def _child(kind: str, vocab: int, o: dict, queue: Any) -> None:
    import traceback

    try:
        run = {"soak": run_soak, "size": run_size, "ckpt": run_ckpt_check}[kind]
        queue.put(("ok", run(vocab, o)))
    except BaseException:  # reported by the parent
        queue.put(("error", traceback.format_exc()))


def in_process(kind: str, vocab: int, o: dict) -> dict:
    """``run_size`` / ``run_soak`` in a fresh process (its own peak RSS)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(kind, vocab, o, queue))
    proc.start()
    status, value = queue.get()
    proc.join()
    if status != "ok":
        raise RuntimeError(f"the {kind} run at {vocab:,} rows per feature failed:\n{value}")
    return value

