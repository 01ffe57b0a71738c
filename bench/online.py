"""Benchmark: RecModel.online_train of Wide&Deep from a DirectorySource on CPU.

A producer process writes Criteo-like ``.npz`` files (``SyntheticClickSource`` records, one
file = one batch of ``--batch`` records) into a folder with write-then-rename; the trainer
(this process) tails it with ``DirectorySource`` and runs ``RecModel.online_train``
(checkpoint every 30 s, publish every ``--publish-every`` s). Three phases:

1. **baseline** — the same train step (forward, loss, backward, LazyAdam) in a hand-written
   loop over batches already in memory: what the model costs on this CPU share.
2. **throughput** — the producer writes as fast as it can, at most 20 files ahead of the
   trainer: sustained records/s trained (warm-up excluded), and its ratio to the baseline.
3. **freshness** — the producer writes at a fixed rate (``--rate``; default half the measured
   throughput, at most 20,000 records/s, so that the trainer keeps up even when its CPU share
   drops): for every record, the time from its file landing (the rename) to the first
   published weights whose training covered it. Median and p90 over the run, and the backlog
   left at the end (a growing backlog means the trainer did not keep up and freshness grows
   with the run's length).

Targets: >= 20,000 records/s on 2 cores at batch 1,000; median freshness <= 5 s
with a 2 s publish cadence.

    .venv/bin/python bench/online.py                 # 60 s per phase
    .venv/bin/python bench/online.py --seconds 20    # a quicker look

The machine load (``os.getloadavg``) and the trainer's CPU share are recorded with the
figures: on a shared machine they explain most of the variation.

``--scale``: the same Wide&Deep with 26 x {10^4, 10^5, 10^6} hashed rows (``--sizes``), sparse
gradients and a row-sparse optimizer (``--optimizer``: LazyAdam or Adagrad), on a Criteo-like
stream (:class:`CriteoLike`: power-law id frequencies, new ids appearing over time), each
size in its own process: the bare step, a throughput phase, the bare step again (the ratio is
to the faster of the two; ``bench/online_paired.py`` measures it in alternation instead, which
the machine's drift does not move) and a freshness phase as above, batches of 4096 records,
with background checkpoints every ``--ckpt-every`` s (one in ``--full-every`` whole, the others
row increments) and delta publishes every ``--publish-every`` s. Per size: records/s and its
ratio to the bare step, peak RSS over the parameter + optimizer bytes, checkpoint write time
and training stall per checkpoint, publish time and bytes, freshness. ``--soak``:
``--soak-minutes`` at the largest size on a stream of ever new ids, RSS sampled every second.

    .venv/bin/python bench/online.py --scale --seconds 150     # 3 sizes, 150 s per phase
    .venv/bin/python bench/online.py --scale --sizes 10000 --seconds 10 --no-doc  # a smoke run
    .venv/bin/python bench/online.py --soak                    # 10 minutes at 26 x 10^6 rows
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import re
import shutil
import statistics
import sys
import tempfile
import textwrap
import threading
import time
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DOC, machine, write_result  # noqa: E402

from lit_amp import auto_mixed_precision  # noqa: E402
from lit_amp.callbacks import Callback  # noqa: E402
from lit_amp.rec import (  # noqa: E402
    CheckpointOptions,
    LazyAdam,
    PublishOptions,
    RecModel,
    StopOptions,
    WideDeep,
)
from lit_amp.rec.sources import DirectorySource, SyntheticClickSource, write_shard  # noqa: E402

MODEL = "WideDeep(13 dense, 26 cat x 10,000 hashed ids, embed 16, MLP 256-128), sparse, LazyAdam"
TARGET_RATE = 20_000.0
TARGET_FRESHNESS = 5.0


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


def update_doc(result: dict) -> None:
    """Replace (or append) this benchmark's section of docs/benchmarks.md."""
    thr, fr, base = result["throughput"], result["freshness"], result["baseline"]
    m = result["machine"]
    ok_rate = thr["sustained_records_per_s"] >= TARGET_RATE
    med = fr["freshness_median_s"]
    ok_fresh = med is not None and med <= TARGET_FRESHNESS

    def mark(ok: bool) -> str:
        return "met" if ok else "**missed**"

    rate_fr = fr["producer_rate"]
    rows = [
        ("bare train step, in-memory batches (records/s)", f"{base['records_per_s']:,.0f}", "", ""),
        (
            "bare train step per CPU-second (a dedicated core)",
            f"{base['records_per_cpu_s']:,.0f}",
            "",
            "",
        ),
        (
            "sustained records/s trained (producer as fast as the trainer)",
            f"{thr['sustained_records_per_s']:,.0f}",
            ">= 20,000",
            mark(ok_rate),
        ),
        (
            "ratio to the bare step",
            f"{thr['sustained_records_per_s'] / base['records_per_s']:.2f}",
            "",
            "",
        ),
        (
            "online_train records per trainer CPU-second (a dedicated core)",
            f"{thr['records_per_cpu_s']:,.0f}",
            "",
            "",
        ),
        ("trainer CPU share (CPU s / wall s)", f"{thr['trainer_cpu_share']:.2f}", "", ""),
        (
            f"freshness median at {rate_fr:,.0f} records/s, publish every "
            f"{result['publish_every']} s",
            _s(med),
            "<= 5 s",
            mark(ok_fresh),
        ),
        (
            "freshness p90 / max",
            f"{_s(fr['freshness_p90_s'])} / {_s(fr['freshness_max_s'])}",
            "",
            "",
        ),
        (
            "records/s trained in the freshness phase; backlog at its end (records)",
            f"{fr['sustained_records_per_s']:,.0f}; {fr['backlog_end_records']:,}",
            "",
            "",
        ),
    ]
    table = "| measure | value | target | |\n|---|---:|---:|---|\n" + "\n".join(
        f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows
    )
    section = f"""<!-- bench:online:start -->
## Online training (`bench/online.py`, issue #7)

{MODEL}; batch {result["batch"]}; one `.npz` file per batch, written by a producer process
with write-then-rename and tailed by `DirectorySource`; `RecModel.online_train` with a
checkpoint every 30 s and a publish every {result["publish_every"]} s; {result["threads"]}
torch thread(s) in the trainer (the producer has the other core); {result["seconds"]:.0f} s per
phase. Freshness: time from a file's rename into the folder to the first published weights
trained on it, per record. Throughput on this shared machine follows the CPU share the trainer
gets (other jobs ran at the same time); the per-CPU-second rows show what a dedicated core
gives. Earlier run: `bench/results/online_run1.json`.

Machine: {m["cpu"]}, {m["cores"]} cores, torch {m["torch"]}, shared with other jobs (load
average {thr["loadavg_start"][0]:.1f} at the start of the throughput phase); {result["date"]}.

{table}

Reproduce: `.venv/bin/python bench/online.py` (raw numbers in `bench/results/online.json`).
<!-- bench:online:end -->
"""
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    pattern = re.compile(r"<!-- bench:online:start -->.*?<!-- bench:online:end -->\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    DOC.write_text(text)


def _s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="per online phase")
    ap.add_argument("--batch", type=int, default=None,
                    help="records per batch and per file (default: 4096 for --scale, the batch "
                    "of training at recommendation scale; 1000 otherwise)")
    ap.add_argument("--rate", type=float, default=None, help="freshness-phase records/s")
    ap.add_argument(
        "--rate-fraction",
        type=float,
        default=0.5,
        help="without --rate: this fraction of the measured throughput (at most 20,000/s; "
        "--scale: at most --rate-cap)",
    )
    ap.add_argument("--publish-every", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the trainer")
    ap.add_argument("--no-doc", action="store_true", help="do not update docs/benchmarks.md")
    ap.add_argument("--scale", action="store_true", help="the scale axis (see the docstring)")
    ap.add_argument("--soak", action="store_true", help="the memory soak at the largest size")
    ap.add_argument("--ckpt-check", action="store_true",
                    help="one background checkpoint per size while training, checked byte "
                    "for byte, against a checkpoint written by the loop")
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000],
                    help="--scale / --soak: rows per feature")
    ap.add_argument("--optimizer", choices=("lazyadam", "adagrad"), default="lazyadam")
    ap.add_argument("--amp", choices=("O0", "O1", "O2"), default="O0",
                    help="--scale/--soak: auto_mixed_precision of the network (bf16 on the CPU), "
                         "for the bare step and the online phases alike")
    ap.add_argument("--collisionless", action="store_true",
                    help="--scale / --soak: IdEmbedding tables (one row per id) instead of hashed")
    ap.add_argument("--ckpt-every", type=float, default=60.0, help="--scale: seconds")
    ap.add_argument("--full-every", type=int, default=10,
                    help="--scale / --soak: one checkpoint in this many whole, the others row "
                    "increments (CheckpointOptions.full_every_n_checkpoints); 1: all whole")
    ap.add_argument("--full-publishes", action="store_true",
                    help="--scale: full publishes instead of deltas")
    ap.add_argument("--new-frac", type=float, default=0.02,
                    help="--scale: fraction of ids never seen before")
    ap.add_argument("--rate-cap", type=float, default=40_000.0)
    ap.add_argument("--bare-seconds", type=float, default=20.0)
    ap.add_argument("--soak-minutes", type=float, default=10.0)
    ap.add_argument("--soak-rate", type=float, default=20_000.0)
    ap.add_argument("--soak-new-frac", type=float, default=0.1)
    args = ap.parse_args()
    if args.batch is None:
        args.batch = SCALE_BATCH if args.scale else 1000
    if args.scale or args.soak or args.ckpt_check:
        run_scale_or_soak(args)
    else:
        run_legacy(args)


def run_legacy(args: argparse.Namespace) -> None:
    """The Wide&Deep at 26 x 10,000 rows on SyntheticClickSource: bare step, throughput,
    freshness (``docs/benchmarks.md``'s "Online training" section)."""
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    warmup = min(5.0, args.seconds / 4)

    root = Path(tempfile.mkdtemp(prefix="lit_amp_bench_online_"))
    try:
        print(f"baseline: bare train step for {min(args.seconds, 20):.0f} s ...", flush=True)
        base = run_baseline(min(args.seconds, 20.0), args.batch)
        print(f"  {base['records_per_s']:,.0f} records/s", flush=True)
        print(f"throughput: {args.seconds:.0f} s ...", flush=True)
        thr = run_online(
            root / "throughput",
            seconds=args.seconds,
            batch=args.batch,
            rate=0.0,
            publish_every=args.publish_every,
            warmup=warmup,
        )
        print(f"  {thr['sustained_records_per_s']:,.0f} records/s", flush=True)
        rate = args.rate or min(TARGET_RATE, args.rate_fraction * thr["sustained_records_per_s"])
        rate = max(rate, float(args.batch))
        print(f"freshness: {args.seconds:.0f} s at {rate:,.0f} records/s ...", flush=True)
        fr = run_online(
            root / "freshness",
            seconds=args.seconds,
            batch=args.batch,
            rate=rate,
            publish_every=args.publish_every,
            warmup=warmup,
        )
        print(f"  median {_s(fr['freshness_median_s'])}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    result = {
        "model": MODEL,
        "batch": args.batch,
        "seconds": args.seconds,
        "publish_every": args.publish_every,
        "threads": args.threads,
        "targets": {"records_per_s": TARGET_RATE, "freshness_median_s": TARGET_FRESHNESS},
        "baseline": base,
        "throughput": thr,
        "freshness": fr,
        "ratio_to_bare_step": thr["sustained_records_per_s"] / base["records_per_s"],
    }
    path = write_result("online", result)
    result = {**result, "machine": machine(), "date": time.strftime("%Y-%m-%d")}
    print(f"\n{'measure':52s} {'value':>12s}  target")
    print(f"{'bare train step (records/s)':52s} {base['records_per_s']:12,.0f}")
    print(f"{'sustained records/s trained':52s} {thr['sustained_records_per_s']:12,.0f}  >= 20,000")
    print(f"{'ratio to the bare step':52s} {result['ratio_to_bare_step']:12.2f}")
    print(
        f"{'records per trainer CPU-second (bare / online)':52s} "
        f"{base['records_per_cpu_s']:12,.0f} / {thr['records_per_cpu_s'] or 0:,.0f}"
    )
    print(
        f"{'freshness median (s) at ' + format(rate, ',.0f') + ' rec/s':52s} "
        f"{_s(fr['freshness_median_s']):>12s}  <= 5 s"
    )
    print(f"{'freshness p90 (s)':52s} {_s(fr['freshness_p90_s']):>12s}")
    print(
        f"{'backlog at the end of the freshness phase (records)':52s} "
        f"{fr['backlog_end_records']:12,}"
    )
    print(f"load average during the run: {thr['loadavg_start']} -> {fr['loadavg_end']}")
    print("written:", path)
    if not args.no_doc:
        update_doc(result)
        print("updated:", DOC)



# ---------------------------------------------------------------------------- scale axis
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
    fixed 100 instead; bench/bare_batches.py compares the two (docs/benchmarks.md)."""

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
    from lit_amp.rec.online.snapshot import Snapshots

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


def run_scale_or_soak(args: argparse.Namespace) -> None:
    o = {k: getattr(args, k) for k in (
        "seconds", "batch", "rate", "rate_fraction", "rate_cap", "publish_every", "threads",
        "optimizer", "collisionless", "amp", "ckpt_every", "full_every", "full_publishes",
        "new_frac",
        "bare_seconds", "soak_minutes", "soak_rate", "soak_new_frac")}
    model = (f"WideDeep(13 dense, 26 cat, embed 16 + 1 wide, MLP 256-128), sparse, "
             f"{'LazyAdam' if args.optimizer == 'lazyadam' else 'Adagrad'}, "
             f"{'IdEmbedding (collision-free)' if args.collisionless else 'hashed'} tables"
             + ("" if args.amp == "O0" else f", auto_mixed_precision {args.amp} bfloat16"))
    common = {"model": model, "batch": args.batch, "threads": args.threads,
              "publish_every": args.publish_every, "ckpt_every": args.ckpt_every,
              "full_every": args.full_every,
              "delta_publishes": not args.full_publishes, "loadavg_start": os.getloadavg(),
              "targets": SCALE_TARGETS}
    if args.ckpt_check:
        rows = [in_process("ckpt", vocab, o) for vocab in args.sizes]
        path = write_result("online_checkpoint", {**common, "sizes": rows, "options": o})
        for r in rows:
            print(f"[{r['vocab']:,}] stall {1e3 * r['stall_s']:.0f} ms, write {r['write_s']:.1f} s "
                  f"(in the loop: {r['in_loop_write_s']:.1f} s), peak RSS "
                  f"{r['rss_over_state']:.2f} x state, {len(r['tensors_differing'])} of "
                  f"{r['tensors_checked']} tensors differ")
        print("written:", path)
        if not args.no_doc:
            update_scale_doc(None, None, rows)
        return
    if args.soak:
        soak = in_process("soak", max(args.sizes), o)
        path = write_result("online_soak", {**common, "soak": soak, "options": o})
        print(f"peak RSS {soak['peak_rss_bytes'] / 2**30:.2f} GiB = "
              f"{soak['rss_over_state']:.2f} x parameters + optimizer state; slope over the "
              f"last half {(soak['rss_slope_bytes_per_min_last_half'] or 0) / 2**20:+.1f} MiB/min")
        print("written:", path)
        if not args.no_doc:
            update_scale_doc(None, soak)
        return
    rows = []
    for vocab in args.sizes:
        rows.append(in_process("size", vocab, o))
        r = rows[-1]
        print(f"[{vocab:,}] {r['throughput']['sustained_records_per_s']:,.0f} records/s "
              f"({r['ratio_to_bare']:.2f} x bare), peak RSS {r['rss_over_state']:.2f} x state, "
              f"stall {1e3 * (r['checkpoint']['stall_s_max'] or 0):.0f} ms", flush=True)
    result = {**common, "sizes": rows, "options": o, "loadavg_end": os.getloadavg()}
    path = write_result("online_scale", result)
    print("written:", path)
    if not args.no_doc:
        update_scale_doc(result, None)


def _gb(b: float | None) -> str:
    return "n/a" if b is None else f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"


def _ms(s: float | None) -> str:
    return "n/a" if s is None else f"{1e3 * s:.0f} ms"


def _scale_table(result: dict) -> str:
    head = ("| rows per feature (total) | params + optimizer | bare step | sustained | ratio "
            "| peak RSS / state | checkpoint write | stall per checkpoint (median / max) | "
            "in-loop checkpoint | publish (median) | bytes per publish: full / delta | "
            "freshness median / p90 |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            "---:|\n")
    lines = []
    for r in result["sizes"]:
        c, p, fr = r["checkpoint"], r["publish"], r["freshness"]
        lines.append(
            f"| {r['vocab']:,} ({r['rows'] / 1e6:g} M) "
            f"| {_gb(r['param_bytes'] + r['optimizer_bytes'])} "
            f"| {r['bare']['records_per_s']:,.0f}/s "
            f"| {r['throughput']['sustained_records_per_s']:,.0f}/s "
            f"| {r['ratio_to_bare']:.2f} | {r['rss_over_state']:.2f} "
            f"| {c['write_s_median'] or 0:.1f} s | {_ms(c['stall_s_median'])} / "
            f"{_ms(c['stall_s_max'])} | {c['in_loop_stall_s'] or 0:.1f} s "
            f"| {_ms(p['publish_s_median'])} | {_gb(p['full_bytes'])} / "
            f"{_gb(p['delta_bytes_median'])} "
            f"| {_s(fr['freshness_median_s'])} / {_s(fr['freshness_p90_s'])} |")
    return head + "\n".join(lines)


def update_scale_doc(result: dict | None, soak: dict | None,
                     ckpt: list[dict] | None = None) -> None:
    """Replace (or append) the scale axis' sections of docs/benchmarks.md (those given)."""
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    m = machine()
    if ckpt:
        text = _replace_section(text, "online-checkpoint", _ckpt_section(ckpt, m))
    if result is not None:
        o = result["options"]
        intro = textwrap.fill(
            f"{result['model']}; batch {result['batch']}; a Criteo-like stream (power-law ids "
            f"hashed over 62 bits, {o['new_frac']:.0%} new ids); producer process + "
            f"`DirectorySource` as in the section above; "
            f"{'delta' if result['delta_publishes'] else 'full'} publishes every "
            f"{result['publish_every']} s; background checkpoints every "
            f"{result['ckpt_every']:.0f} s (one in {o.get('full_every', 1)} whole, the others "
            f"row increments); {o['seconds']:.0f} s per phase. \"State\" is "
            "parameter + optimizer-state bytes. \"Stall per checkpoint\": how long the training "
            "loop was blocked by a background checkpoint (a wait for the previous write "
            "included); \"in-loop checkpoint\": the final checkpoint, written by the loop as "
            "every checkpoint was before background writes (what each one stalled). Freshness "
            f"at {o['rate_fraction']:.0%} of the throughput (at most {o['rate_cap']:,.0f} "
            f"records/s). Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}; load "
            f"average {result['loadavg_start'][0]:.1f} at the start; "
            f"{time.strftime('%Y-%m-%d')}.", 92)
        body = f"""<!-- bench:online-scale:start -->
## Online training at scale (`bench/online.py --scale`)

{intro}

{_scale_table(result)}

Targets at 26 M rows: sustained >= 0.9 x the bare step and >= 40,000 records/s; peak RSS <=
1.5 x state; stall per checkpoint <= 100 ms; publish bytes per 2 s <= 5 % of a full publish;
freshness median <= 2 s, p90 <= 4 s. Raw numbers: `bench/results/online_scale.json`.
<!-- bench:online-scale:end -->
"""
        text = _replace_section(text, "online-scale", body)
    if soak is not None:
        ck = soak["checkpoint"]
        body = f"""<!-- bench:online-soak:start -->
## Memory soak (`bench/online.py --soak`)

{soak["rows"] / 1e6:g} M rows, {soak["seconds"] / 60:.0f} minutes, {soak["records_trained"]:,}
records trained (about {soak["distinct_new_ids_seen"]:,} ids never seen before), background
checkpoints and publishes as above. Peak RSS {_gb(soak["peak_rss_bytes"])} =
{soak["rss_over_state"]:.2f} x state ({_gb(soak["param_bytes"] + soak["optimizer_bytes"])});
budget 1.5 x state = {_gb(soak["budget_bytes"])}; RSS slope over the last half
{(soak["rss_slope_bytes_per_min_last_half"] or 0) / 2**20:+.1f} MiB/min. Evictions
{soak["evictions"]:,}, overflows {soak["overflows"]:,}. Checkpoints: {ck["background"]} in the
background, {ck["increments"]} of them row increments (median {_gb(ck["increment_bytes_median"])},
written in {_s(ck["increment_write_s_median"])}; whole: {_gb(ck["bytes"])} in
{_s(ck["whole_write_s_median"])}); stall per checkpoint median {_ms(ck["stall_s_median"])}, max
{_ms(ck["stall_s_max"])}. Machine: {m["cpu"]};
{time.strftime("%Y-%m-%d")}. Raw samples: `bench/results/online_soak.json`.
<!-- bench:online-soak:end -->
"""
        text = _replace_section(text, "online-soak", body)
    DOC.write_text(text)


_CKPT_HEAD = (
    "| rows per feature (total) | state | loop stall (background) | in-loop write (before) "
    "| background write | rows copied on write | speed during the write | peak RSS / state "
    "| tensors differing | load average |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def _ckpt_section(rows: list[dict], m: dict) -> str:
    lines = "\n".join(
        f"| {r['vocab']:,} ({r['rows'] / 1e6:g} M) | {_gb(r['param_bytes'] + r['optimizer_bytes'])}"
        f" | {_ms(r['stall_s'])} | {r['in_loop_write_s']:.1f} s | {r['write_s']:.1f} s "
        f"({r['writer_cpu_s']:.1f} s CPU) | {r['cow_rows']:,} ({_gb(r['cow_bytes'])}) "
        f"| {r['records_per_s_during_write'] / r['bare_records_per_s']:.2f} "
        f"| {r['rss_over_state']:.2f} | {len(r['tensors_differing'])} of {r['tensors_checked']} "
        f"| {r['loadavg'][0]:.1f} |" for r in rows)
    return f"""<!-- bench:online-checkpoint:start -->
## A background checkpoint at scale (`bench/online.py --ckpt-check`)

Wide&Deep as in the scale axis, LazyAdam, batch 1000, the train step in a plain loop (no
producer): one checkpoint taken as `online_train` takes it in the background (snapshot,
copy-on-write of the table and its optimizer state, a writer thread) while
the loop keeps stepping, then the same dict written by the loop with `torch.save` (what
every checkpoint stalled before), then the file compared byte for byte (CRC32 per tensor)
with the state at the snapshot. "Speed during the write": records/s while the file was
being written over records/s before.

{_CKPT_HEAD}
{lines}

Machine: {m["cpu"]}, {m["cores"]} cores, shared with other jobs (the load average column);
{time.strftime("%Y-%m-%d")}. Raw numbers: `bench/results/online_checkpoint.json`.
<!-- bench:online-checkpoint:end -->
"""


def _replace_section(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"<!-- bench:{name}:start -->.*?<!-- bench:{name}:end -->\n?", re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: body, text)
    return text.rstrip("\n") + "\n\n" + body


if __name__ == "__main__":
    main()
