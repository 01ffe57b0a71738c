"""The online benchmarks' shared workload: the Wide&Deep models (26 x 10^4 hashed rows, and
the scale axis's 26 x --vocab), the Criteo-like stream and its producer process, the online
phases (``run_online``: throughput or freshness through ``RecModel.online_train``) and the bare
step they are divided by (``run_baseline``), and the machine counters the paired runs record."""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import resource
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bench._common import Target, parser
from lit_amp import auto_mixed_precision
from lit_amp.callbacks import Callback
from lit_amp.rec import (
    CheckpointOptions,
    LazyAdam,
    PublishOptions,
    RecModel,
    StopOptions,
    WideDeep,
    huge_pages,
)
from lit_amp.rec.sources import DirectorySource, SyntheticClickSource, write_shard

MODEL = "WideDeep(13 dense, 26 cat x 10,000 hashed ids, embed 16, MLP 256-128), sparse, LazyAdam"
TARGET_RATE = 20_000.0
TARGET_FRESHNESS = 5.0
TARGETS = (Target("records_per_s", ">=", TARGET_RATE),
           Target("freshness_median_s", "<=", TARGET_FRESHNESS))


def make_model() -> tuple[RecModel, WideDeep]:
    torch.manual_seed(0)
    net = WideDeep(vocab_size=10_000, embed_dim=16, hidden=(256, 128), sparse=True)
    return RecModel(net, nn.BCEWithLogitsLoss(), LazyAdam(net.parameters(), lr=1e-3)), net


# ---------------------------------------------------------------------------- streams
def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (uint64 -> uint64): spreads ids over the whole id space."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class CriteoLike:
    """Criteo-like click records for the scale axis: power-law ids, new ids over time.

    Per record: 13 log-normal dense counts and 26 categorical ids. An id is the ``r``-th most
    popular of its feature with ``r`` drawn from Zipf(``alpha``), hashed over 62 bits (hot ids
    land anywhere in a table, as real hashed ids do); a fraction ``new_frac`` of the ids are
    brand new (never seen before, never seen again): an id stream that grows without bound.
    The label follows a hidden logistic model of the ids and the counts. Batch ``b`` depends
    only on ``(seed, b)``.
    """

    def __init__(self, batch: int, seed: int = 0, alpha: float = 1.2,
                 new_frac: float = 0.02) -> None:
        self.batch, self.seed, self.alpha, self.new_frac = batch, seed, alpha, new_frac
        g = np.random.default_rng([seed, 0x5EED])
        self.effect = g.normal(0.0, 1.0, 997).astype(np.float32)
        self.dense_w = g.normal(0.0, 0.35, 13).astype(np.float32)

    def columns(self, b: int) -> dict:
        n = self.batch
        g = np.random.default_rng([self.seed, b])
        dense = np.floor(g.lognormal(1.0, 1.2, (n, 13))).astype(np.float32)
        rank = np.minimum(g.zipf(self.alpha, (n, 26)), 2**40).astype(np.uint64)
        fresh = g.random((n, 26)) < self.new_frac
        serial = (np.uint64(b * n) + np.arange(n, dtype=np.uint64))[:, None] * np.uint64(26) \
            + np.arange(26, dtype=np.uint64)
        key = np.where(fresh, np.uint64(2**41) + serial, rank)
        ids = (_mix(key * np.uint64(32) + np.arange(26, dtype=np.uint64))
               >> np.uint64(2)).astype(np.int64)
        logit = 0.45 * self.effect[ids % 997].sum(axis=1) / 5 + np.log1p(dense) @ self.dense_w
        label = (g.random(n) < 1.0 / (1.0 + np.exp(1.3 - logit))).astype(np.float32)
        return {"id": np.arange(b * n, (b + 1) * n, dtype=np.int64), "label": label,
                "dense": dense, "cat": ids}


def make_stream(spec: tuple, batch: int) -> SyntheticClickSource | CriteoLike:
    """``("synthetic",)``: SyntheticClickSource's records; ``("criteo", new_frac)``."""
    if spec[0] == "criteo":
        return CriteoLike(batch, new_frac=spec[1])
    return SyntheticClickSource(batch_size=batch, seed=0)


# ---------------------------------------------------------------------------- producer
def producer(
    data_dir: str,
    batch: int,
    rate: float,
    backlog: int,
    trained: mp.Value,
    stop: mp.Event,
    ready: mp.Event,
    land_log: str,
    stream: tuple = ("synthetic",),
    pause: Any = None,
    nice: int = 0,
) -> None:
    """Write one-batch files; ``rate`` > 0: at that rate, else as fast as the backlog allows;
    none while ``pause`` (an event) is set; ``nice``: this process's niceness increment."""
    if nice:
        os.nice(nice)
    torch.set_num_threads(1)
    gen = make_stream(stream, batch)
    gen.columns(0)
    ready.set()
    t0 = time.monotonic()
    i = 0
    with open(land_log, "w", buffering=1) as log:
        while not stop.is_set():
            if pause is not None and pause.is_set():
                time.sleep(0.002)
                if rate > 0:  # after the pause, resume at the rate, not catch up
                    t0 = time.monotonic() - i * batch / rate
                continue
            if rate > 0:
                wait = t0 + i * batch / rate - time.monotonic()
                if wait > 0:
                    stop.wait(wait)
                    continue
            elif (i * batch) - trained.value > backlog * batch:
                time.sleep(0.002)
                continue
            cols = gen.columns(i)
            name = f"part-{i:09d}"
            write_shard(data_dir, name, cols, "npz")
            log.write(f"{name}.npz {time.time():.6f} {len(cols['id'])}\n")
            i += 1


class Progress(Callback):
    """Shares the records trained with the producer; samples (time, records) every step."""

    def __init__(self, trained: mp.Value) -> None:
        self.trained = trained
        self.samples: list[tuple[float, int]] = []
        self.n = 0

    def on_train_step_end(self, run_context) -> None:
        self.n += len(run_context.original_args().train_dataset_element[1])
        self.trained.value = self.n
        self.samples.append((time.monotonic(), self.n))


def sustained_rate(samples: list[tuple[float, int]], warmup: float) -> float:
    """Records/s between ``warmup`` seconds after the first step and the last step."""
    if len(samples) < 2:
        return 0.0
    t_first = samples[0][0]
    after = [s for s in samples if s[0] >= t_first + warmup] or samples
    (t0, n0), (t1, n1) = after[0], samples[-1]
    return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


def window_rates(samples: list[tuple[float, int]], window: float) -> list[float]:
    """Records/s in each ``window`` seconds after the first step (the last, partial one left
    out)."""
    if len(samples) < 2:
        return []
    out, at, n_at = [], samples[0][0], samples[0][1]
    for t, n in samples:
        if t - at >= window:
            out.append(round((n - n_at) / (t - at)))
            at, n_at = t, n
    return out


# ---------------------------------------------------------------------------- instruments
def rss_bytes(field: str = "VmRSS") -> int:
    """This process's resident set (``VmHWM``: its peak so far), from /proc."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class RssSampler:
    """Samples this process's RSS every ``period`` seconds in a thread."""

    def __init__(self, period: float) -> None:
        self.period, self.samples = period, []
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.samples.append((time.monotonic() - self._t0, rss_bytes()))

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join()
        return self.samples


class CheckpointFigures(logging.Handler):
    """Collects what each checkpoint took (the checkpoint logger's ``lit_amp_checkpoint``)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.figures: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        if hasattr(record, "lit_amp_checkpoint"):
            self.figures.append(dict(record.lit_amp_checkpoint))

    def __enter__(self) -> CheckpointFigures:
        logger = logging.getLogger("lit_amp.rec.online.checkpoints")
        self._level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger("lit_amp.rec.online.checkpoints")
        logger.removeHandler(self)
        logger.setLevel(self._level)


class PublishTimes:
    """Wall time of each ``Publisher.publish`` call of this process (the loop is blocked)."""

    def __enter__(self) -> PublishTimes:
        from lit_amp.rec.online import publisher

        self.times: list[float] = []
        self._cls, self._real = publisher.Publisher, publisher.Publisher.publish
        real, times = self._real, self.times

        def timed(pub, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return real(pub, *args, **kwargs)
            finally:
                times.append(time.perf_counter() - t0)

        self._cls.publish = timed
        return self

    def __exit__(self, *exc: object) -> None:
        self._cls.publish = self._real


# ---------------------------------------------------------------------------- phases
def _freshness(land_log: str, publishes: list) -> tuple[dict, list[float]]:
    """Per file (one batch), the first publish covering it; one value per record."""
    lands: dict[str, tuple[float, int]] = {}
    for line in Path(land_log).read_text().splitlines():
        name, t, n = line.split()
        lands[name] = (float(t), int(n))
    first_pub: dict[str, float] = {}
    seen: frozenset = frozenset()
    for t_pub, done in publishes:
        for name in done - seen:
            first_pub.setdefault(name, t_pub)
        seen = done
    fresh = []
    for name, t_pub in first_pub.items():
        if name in lands:
            t_land, n = lands[name]
            fresh.extend([t_pub - t_land] * n)
    fresh.sort()
    return lands, fresh


def run_online(
    workdir: Path, *, seconds: float, batch: int, rate: float, publish_every: float, warmup: float,
    model: RecModel | None = None, stream: tuple = ("synthetic",), ckpt_every: float = 30.0,
    publish: dict | None = None, delete_consumed: bool = False, full_every: int = 1,
    callbacks: tuple = (), pause: Any = None, producer_nice: int = 0,
) -> dict:
    """One online phase: producer process + online_train for ``seconds`` (``callbacks`` after
    the progress sampler; ``pause``: a spawn-context event that pauses the producer)."""
    data = workdir / "data"
    data.mkdir(parents=True)
    ctx = mp.get_context("spawn")
    trained = ctx.Value("q", 0, lock=False)
    stop, ready = ctx.Event(), ctx.Event()
    land_log = str(workdir / "lands.txt")
    prod = ctx.Process(
        target=producer,
        args=(str(data), batch, rate, 20, trained, stop, ready, land_log, stream, pause,
              producer_nice),
        daemon=True,
    )
    prod.start()
    if not ready.wait(timeout=300):  # its imports take seconds on a loaded machine
        stop.set()
        raise RuntimeError("the producer process did not start within 300 s")
    if model is None:
        model, _ = make_model()
    progress = Progress(trained)
    publishes: list[tuple[float, frozenset]] = []  # (published_at, files covered)
    sizes: list[tuple[str, int]] = []  # (kind, bytes) per publish

    def hook(info: dict) -> None:
        publishes.append((info["published_at"], frozenset(info["cursor"]["done"])))
        sizes.append((info.get("kind", "full"), info.get("bytes", 0)))

    source = DirectorySource(data, batch_size=batch, poll_interval=0.005,
                             delete_consumed=delete_consumed)
    load0 = os.getloadavg()
    cpu0 = time.process_time()
    try:
        with CheckpointFigures() as ckpts, PublishTimes() as pub_times:
            summary = model.online_train(
                source,
                callbacks=[progress, *callbacks],
                stop=StopOptions(max_time=seconds),
                checkpoint=CheckpointOptions(workdir / "ckpt", ckpt_every_n_seconds=ckpt_every,
                                             keep_checkpoint_max=2,
                                             full_every_n_checkpoints=full_every),
                publish=PublishOptions(workdir / "publish", publish_every_n_seconds=publish_every,
                                       publish_hook=hook, **(publish or {})),
            )
    finally:
        stop.set()
        prod.join(timeout=30)
    cpu = time.process_time() - cpu0
    load1 = os.getloadavg()
    lands, fresh = _freshness(land_log, publishes)
    return {
        "seconds": seconds,
        "producer_rate": rate or "max (backlog <= 20 files)",
        "records_trained": summary.records,
        "steps": summary.steps,
        "elapsed_s": summary.elapsed_s,
        "sustained_records_per_s": sustained_rate(progress.samples, warmup),
        # records/s in each 10 s of the run, and when each checkpoint was taken (s from the
        # first step): where the writes cost
        "rates_10s": window_rates(progress.samples, 10.0),
        "checkpoint_at_s": [round(progress.samples[f["step"] - 1][0] - progress.samples[0][0], 1)
                            for f in ckpts.figures if 0 < f["step"] <= len(progress.samples)],
        "records_landed": sum(n for _, n in lands.values()),
        "backlog_end_records": sum(n for _, n in lands.values()) - summary.records,
        "publishes": len(publishes),
        "publish_kinds": [k for k, _ in sizes],
        "publish_bytes": [b for _, b in sizes],
        "publish_s": pub_times.times,
        "checkpoints": ckpts.figures,
        "freshness_median_s": statistics.median(fresh) if fresh else None,
        "freshness_p90_s": fresh[int(0.9 * (len(fresh) - 1))] if fresh else None,
        "freshness_max_s": fresh[-1] if fresh else None,
        "records_published": len(fresh),
        "trainer_cpu_share": cpu / summary.elapsed_s if summary.elapsed_s else None,
        # what one dedicated core would train: records per CPU-second of the trainer process
        "records_per_cpu_s": summary.records / cpu if cpu else None,
        "loadavg_start": load0,
        "loadavg_end": load1,
        "stop_reason": summary.stop_reason,
    }


def run_baseline(seconds: float, batch: int, net: nn.Module | None = None,
                 opt: torch.optim.Optimizer | None = None, stream: tuple = ("synthetic",),
                 n_batches: int = 20, batches: list | None = None) -> dict:
    """The bare train step over in-memory batches (no Lightning, no files); ``batches``:
    these (from :func:`bare_batches`) instead of ``n_batches`` new ones."""
    if net is None:
        _, net = make_model()
        opt = LazyAdam(net.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    batches = batches or bare_batches(stream, batch, n_batches)
    t0 = time.monotonic()
    cpu0 = time.process_time()
    n = 0
    while time.monotonic() - t0 < seconds:
        features, label = batches[n % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss_fn(net(features), label).backward()
        opt.step()
        n += 1
    wall = time.monotonic() - t0
    return {
        "seconds": wall,
        "steps": n,  # more than len(batches): some were trained again
        "records_per_s": n * batch / wall,
        "records_per_cpu_s": n * batch / (time.process_time() - cpu0),
        "cpu_share": (time.process_time() - cpu0) / wall,
        "loadavg": os.getloadavg(),
    }


#: ``--scale``'s default batch: click-through models at this size train on batches of
#: thousands; a 1000-record step pays its fixed per-step costs (a file read and validated,
#: Lightning's hooks, the guard: about 6 ms) four times as often (docs/benchmarks.md)
SCALE_BATCH = 4096
SCALE_TARGETS = {"records_per_s": 40_000.0, "ratio_to_bare": 0.9, "rss_over_state": 1.5,
                 "stall_s": 0.1, "publish_fraction": 0.05, "freshness_median_s": 2.0,
                 "freshness_p90_s": 4.0}


def scale_model(vocab: int, optimizer: str, collisionless: bool,
                amp: str = "O0") -> tuple[nn.Module, Any]:
    """Wide&Deep with ``26 x vocab`` rows of width 17 (16 deep + 1 wide), sparse gradients;
    ``amp``: ``auto_mixed_precision`` at that level in bfloat16 (O1: the MLP's layers)."""
    torch.manual_seed(0)
    net = WideDeep(vocab_size=vocab, embed_dim=16, hidden=(256, 128), sparse=True,
                   collisionless=collisionless)
    if amp != "O0":
        net = auto_mixed_precision(net, amp, dtype=torch.bfloat16)
    if optimizer == "adagrad":
        return net, torch.optim.Adagrad(net.parameters(), lr=0.01)
    opt = LazyAdam(net.parameters(), lr=1e-3)
    if collisionless:
        net.embedding.attach(opt)  # a reused row's moments start at zero
    return net, opt


def state_bytes(net: nn.Module, opt: Any) -> dict:
    """Bytes of the parameters, the optimizer state and the buffers."""
    def size(ts: Any) -> int:
        return sum(t.numel() * t.element_size() for t in ts if torch.is_tensor(t))

    return {"param_bytes": size(net.parameters()), "buffer_bytes": size(net.buffers()),
            "optimizer_bytes": size(v for st in opt.state.values() for v in st.values())}


def _thin(samples: list, n: int = 400) -> list:
    step = max(1, len(samples) // n)
    return [(round(t, 2), b) for t, b in samples[::step]]


def _median(xs: list) -> float | None:
    return statistics.median(xs) if xs else None


def _is_increment(figure: dict) -> bool:
    return str(figure.get("path", "")).endswith("-rows.ckpt")


def _checkpoint_summary(phases: list[dict]) -> dict:
    figs = [f for ph in phases for f in ph["checkpoints"]]
    bg = [f for f in figs if f["background"]]
    final = [f for f in figs if not f["background"]]
    return {
        "background": len(bg),
        "stall_s_median": _median([f["stall_s"] for f in bg]),
        "stall_s_max": max((f["stall_s"] for f in bg), default=None),
        "stalls_s": [round(f["stall_s"], 4) for f in bg],  # in order: an outlier's place
        "waited_s_max": max((f["waited_s"] for f in bg), default=None),
        "write_s_median": _median([f["write_s"] for f in bg]),
        "bytes": _median([f["bytes"] for f in figs if not _is_increment(f)]),
        "increments": sum(_is_increment(f) for f in bg),
        "increment_bytes_median": _median([f["bytes"] for f in bg if _is_increment(f)]),
        "increment_write_s_median": _median([f["write_s"] for f in bg if _is_increment(f)]),
        "whole_write_s_median": _median([f["write_s"] for f in bg if not _is_increment(f)]),
        "cow_rows_median": _median([f["cow_rows"] for f in bg]),
        "cow_bytes_max": max((f["cow_bytes"] for f in bg), default=None),
        # a checkpoint written by the loop (the final one): what every checkpoint stalled before
        "in_loop_stall_s": _median([f["stall_s"] for f in final]),
    }


def _publish_summary(thr: dict, publish_every: float) -> dict:
    kinds, sizes, times = thr["publish_kinds"], thr["publish_bytes"], thr["publish_s"]
    full = [b for k, b in zip(kinds, sizes) if k == "full"]
    delta = [b for k, b in zip(kinds, sizes) if k != "full"]
    return {
        "count": len(sizes), "full": len(full), "delta": len(delta),
        "full_bytes": _median(full), "delta_bytes_median": _median(delta),
        "delta_bytes_max": max(delta, default=None),
        "bytes_per_interval_over_full": (_median(delta) / _median(full)
                                          if delta and full else None),
        "publish_s_median": _median(times), "publish_s_max": max(times, default=None),
        "every_s": publish_every,
    }


def bare_batches(stream: tuple, batch: int, n: int, start: int = 0) -> list:
    """Batches ``start .. start + n - 1`` of ``stream`` as tensors, for the bare step."""
    gen, schema = make_stream(stream, batch), SyntheticClickSource(batch_size=batch).schema
    return [schema.to_batch(gen.columns(i)) for i in range(start, start + n)]


class FreshBatches:
    """Batches of ``stream`` for the bare step that no window has trained on: each
    :meth:`take` continues where the last ended (from batch ``start``, far past any the online
    loop reaches), as the online loop trains each batch once. The bare step cycles over a
    fixed 100 instead; bench.online.bare_batches compares the two (docs/benchmarks.md)."""

    def __init__(self, stream: tuple, batch: int, start: int = 10**7) -> None:
        self.stream, self.batch, self.next = stream, batch, start

    def take(self, n: int) -> list:
        out = bare_batches(self.stream, self.batch, n, self.next)
        self.next += n
        return out


def fault_in(net: nn.Module, opt: torch.optim.Optimizer, batch: int, stream: tuple) -> None:
    """One step (the optimizer state exists), then every page of the parameters and the
    optimizer state written once: the bare step is not timed on first-touch page faults of
    the lazily zeroed state, which the online phases after it no longer pay."""
    [(features, label)] = bare_batches(stream, batch, 1)
    opt.zero_grad(set_to_none=True)
    nn.BCEWithLogitsLoss()(net(features), label).backward()
    opt.step()
    with torch.no_grad():
        for t in [*net.parameters(), *(v for st in opt.state.values() for v in st.values()
                                       if torch.is_tensor(v) and v.is_floating_point())]:
            t.add_(0)


def bare_step(o: dict, net: nn.Module, opt: Any, stream: tuple) -> dict:
    """The bare step's records/s: a 5 s warm-up (not counted: the first seconds after the
    state is faulted in run slower), then three windows of ``bare_seconds / 3``; their median.
    This machine's bare step varies by 10-20 % between windows."""
    batches = bare_batches(stream, o["batch"], 100)  # the same 100 for every window
    run_baseline(5.0, o["batch"], net, opt, batches=batches)
    runs = [run_baseline(o["bare_seconds"] / 3, o["batch"], net, opt, batches=batches)
            for _ in range(3)]
    rates = [r["records_per_s"] for r in runs]
    mid = runs[rates.index(statistics.median(rates))]
    return {**mid, "windows_records_per_s": rates}


# ---------------------------------------------------------------------------- machine counters
def minor_faults() -> int:
    """Minor page faults this thread has taken (``getrusage(RUSAGE_THREAD)``; 0 where the
    platform has no per-thread figure): pages first touched, e.g. of a buffer just mapped."""
    who = getattr(resource, "RUSAGE_THREAD", None)
    return resource.getrusage(who).ru_minflt if who is not None else 0


def run_queue_s() -> float:
    """Seconds this thread has waited on a run queue for a CPU (``/proc`` schedstat; 0.0
    where the kernel does not report it)."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def threads_cpu_s() -> dict[str, float]:
    """Seconds on a CPU of this process's threads, summed by Python thread name (a pool's
    ``_<n>`` suffix dropped; threads Python does not know by their kernel name), from
    ``/proc`` schedstat; empty where the kernel does not report it."""
    names = {t.native_id: t.name.rsplit("_", 1)[0] if t.name.startswith("lit_amp") else t.name
             for t in threading.enumerate()}
    out: dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            name = names.get(int(tid))
            if name is None:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    name = "native:" + f.read().strip()
        except (OSError, IndexError, ValueError):
            continue
        out[name] = out.get(name, 0.0) + ns / 1e9
    return out


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (every CPU's non-idle, non-iowait ticks
    in ``/proc/stat``); 0.0 where there is none."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    busy = sum(v[:8]) - v[3] - v[4]  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def cpu_by_thread(before: dict[str, float], after: dict[str, float], seconds: float) -> dict:
    """Cores used per thread name between two :func:`threads_cpu_s` readings (above 0.01)."""
    used = {k: (v - before.get(k, 0.0)) / seconds for k, v in after.items()}
    return {k: round(v, 3) for k, v in sorted(used.items(), key=lambda kv: -kv[1]) if v > 0.01}


# ---------------------------------------------------------------------------- the bare model
def built(o: dict, stream: tuple) -> tuple:
    """A scale model with every page written and its big tensors collapsed onto huge pages;
    with the fraction of those bytes the kernel backs with huge pages."""
    net, opt = scale_model(o["vocab"], o["optimizer"], False)
    fault_in(net, opt, o["batch"], stream)
    big = [t for t in [*net.parameters(), *(v for st in opt.state.values() for v in st.values()
                                            if torch.is_tensor(v))]
           if t.numel() * t.element_size() >= huge_pages.MIN_BYTES]
    for t in big:
        huge_pages.collapse(t)
    total = sum(t.numel() * t.element_size() for t in big)
    backed = sum(huge_pages.huge_page_bytes(t) for t in big)
    return net, opt, (backed / total if total else None)


def alternation_parser(doc: str, rounds: int) -> argparse.ArgumentParser:
    """The options of a benchmark alternating settings of the bare step on one model
    (bare_batches, cotenant; write_cost adds its own)."""
    ap = parser(doc, doc_option=False)
    ap.add_argument("--vocab", type=int, default=1_000_000, help="rows per feature")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--window", type=float, default=10.0, help="seconds per window")
    ap.add_argument("--batch", type=int, default=SCALE_BATCH)
    ap.add_argument("--new-frac", type=float, default=0.02)
    return ap


def alternation_options(doc: str, rounds: int) -> dict:
    """:func:`alternation_parser`'s options, parsed."""
    return vars(alternation_parser(doc, rounds).parse_args())


def bare_model(o: dict) -> tuple[nn.Module, torch.optim.Optimizer, float | None, tuple]:
    """One thread, and one scale model (LazyAdam, on huge pages: :func:`built`) for
    :func:`alternation_options`' ``o``: ``(net, optimizer, huge-page fraction, stream)``."""
    torch.set_num_threads(1)
    stream = ("criteo", o["new_frac"])
    return (*built({**o, "optimizer": "lazyadam"}, stream), stream)
