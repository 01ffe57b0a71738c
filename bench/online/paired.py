"""The online loop's records/s over the bare step's, the two measured in alternation.

``python -m bench.online --scale`` divides a 150-300 s online phase by a bare step measured before
and after it; this machine's bare step drifts 5-18 % over those minutes, as much as the margin
of the 0.9 x target. Here the two alternate in one process, so the drift hits both alike:
``--online-window`` seconds of ``online_train`` (the producer writing as fast as the trainer
takes, background checkpoints with row increments, delta publishes: workload.py's throughput
phase), then ``--bare-window`` seconds of the bare step on a second copy of the model (its
own table and moments, no hooks), and again. The bare step cycles over 100 batches of the
stream made at the start (bench/online/bare_batches.py measured no difference from batches never
trained before, as the online loop's are). The bare window runs inside a callback, so the
loop waits; the producer is paused, the lit_amp background tasks in flight that are short
(delta publish, file deletion) are waited for first, that wait counted as online time, and a
checkpoint or full-publish write in flight is held between two chunks (its snapshot's lock
taken) until the online window after: its cost lands where the loop runs beside it, as in a
run that never pauses. (What such a write has handed the kernel before the hold, the kernel
may still write back during the bare window; ``--wait-writes`` waits for the writes instead,
which charges their rest to the online side at the full rate: runs 1-16.) Checkpoints are
due every ``--ckpt-every`` seconds of online time. Both copies' table and moments are
collapsed onto huge pages (a copy on fewer would be slower); the backed fraction of each is
reported.

The result: the online total (records over online seconds, the first window left out as the
warm-up) over the bare total, the ratio per cycle (an online window over the mean of the bare
windows either side), and a bootstrap 90 % interval over cycles; per window, the loop thread's
share of time on a CPU and waiting on a run queue for one (``/proc`` schedstat), the cores
each thread of the process used and the machine's busy cores. Writes
``bench/results/online_paired.json``.

    .venv/bin/python -m bench.online.paired                      # 26 M rows, 20 minutes
    .venv/bin/python -m bench.online.paired --vocab 10000 --seconds 60 --online-window 10 \\
        --bare-window 5 --variant smoke                # a smoke run
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import multiprocessing as mp
import shutil
import statistics
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench import _common as harness
from bench._common import load_history, parser, write_result
from bench.online import workload
from bench.online.workload import (
    built,
    cpu_by_thread,
    machine_busy_s,
    minor_faults,
    run_queue_s,
    threads_cpu_s,
)
from lit_amp.callbacks import Callback
from lit_amp.rec import RecModel
from lit_amp.rec.state.snapshot import Snapshot


class GcPauses:
    """The collector's pauses (``gc.callbacks``): total seconds and the longest, per thread
    that ran it; :meth:`take` returns and clears them."""

    def __init__(self) -> None:
        self.total, self.longest, self._t0 = 0.0, 0.0, 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0:
            d = time.perf_counter() - self._t0
            self.total += d
            self.longest = max(self.longest, d)

    def take(self) -> dict:
        out = {"gc_s": round(self.total, 4), "gc_longest_s": round(self.longest, 4)}
        self.total = self.longest = 0.0
        return out


class BackgroundTasks:
    """Every task submitted to a lit_amp thread pool (``lit_amp-*`` threads) while inside;
    :meth:`wait` waits for those not done, :meth:`hold` for those that write no snapshot."""

    def __enter__(self) -> BackgroundTasks:
        self.futures: list[tuple[concurrent.futures.Future, list]] = []  # (task, its snapshots)
        pool = concurrent.futures.ThreadPoolExecutor
        self._real = real = pool.submit
        futures = self.futures

        def submit(ex: Any, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
            future = real(ex, *args, **kwargs)
            if ex._thread_name_prefix.startswith("lit_amp"):
                futures.append((future, [a for a in args if isinstance(a, Snapshot)]))
            return future

        pool.submit = submit
        return self

    def wait(self) -> float:
        """Wait for every task in flight; the seconds waited."""
        t0 = time.monotonic()
        concurrent.futures.wait([f for f, _ in self.futures])
        self.futures.clear()
        return time.monotonic() - t0

    def hold(self) -> tuple[float, list[threading.Lock]]:
        """Wait for the tasks in flight that write no snapshot (delta publishes, deletions)
        and stop the snapshot writes in flight at their next chunk: take the lock they take
        per chunk (:class:`~lit_amp.rec.state.snapshot.Snapshot`'s, which the training
        steps take too). Returns the seconds waited and the locks taken, for :meth:`resume`."""
        t0 = time.monotonic()
        writes = [(f, snaps) for f, snaps in self.futures if snaps and not f.done()]
        concurrent.futures.wait([f for f, snaps in self.futures if not snaps])
        self.futures[:] = writes
        locks = list({id(s._lock): s._lock for _, snaps in writes for s in snaps}.values())
        for lock in locks:
            lock.acquire()
        return time.monotonic() - t0, locks

    @staticmethod
    def resume(locks: list[threading.Lock]) -> None:
        for lock in locks:
            lock.release()

    def __exit__(self, *exc: object) -> None:
        concurrent.futures.ThreadPoolExecutor.submit = self._real


class Alternator(Callback):
    """After every ``online_window`` s of the loop: wait for the background tasks, pause the
    producer, run the bare step for ``bare_window`` s on ``bare`` (net, optimizer), resume."""

    def __init__(self, o: dict, bare: tuple, batches: list, pause: Any,
                 tasks: BackgroundTasks) -> None:
        self.o, self.bare_model, self.batches = o, bare, batches
        self.pause, self.tasks = pause, tasks
        self.online: list[dict] = []
        self.bare: list[dict] = []
        self.t0: float | None = None
        self.cpu0 = 0.0  # the loop thread's CPU time at the window's start
        self.rq0 = 0.0  # ... and its run-queue wait
        self.flt0 = 0  # ... and its minor page faults
        self.threads0: dict[str, float] = {}  # every thread's CPU time (threads_cpu_s)
        self.busy0 = 0.0  # the machine's busy CPU seconds
        self.gc = GcPauses()
        self.n = self.n0 = 0

    def on_train_step_end(self, run_context) -> None:
        self.n += len(run_context.original_args().train_dataset_element[1])
        now = time.monotonic()
        if self.t0 is None:
            self.t0, self.n0, self.cpu0, self.rq0 = now, self.n, time.thread_time(), run_queue_s()
            self.flt0, self.threads0, self.busy0 = minor_faults(), threads_cpu_s(), machine_busy_s()
            return
        if now - self.t0 < self.o["online_window"]:
            return
        cpu = time.thread_time() - self.cpu0
        rq = run_queue_s() - self.rq0
        faults = minor_faults() - self.flt0
        threads = cpu_by_thread(self.threads0, threads_cpu_s(), now - self.t0)
        busy = (machine_busy_s() - self.busy0) / (now - self.t0)
        if self.o["hold_writes"]:
            waited, held = self.tasks.hold()
        else:
            waited, held = self.tasks.wait(), []
        t1 = time.monotonic()
        self.online.append({"seconds": t1 - self.t0, "records": self.n - self.n0,
                            "background_wait_s": waited,
                            "writes_held": len(held),
                            # the loop thread's CPU time over the wall time: below 1 where it
                            # waited (for data, the GIL, a core)
                            "loop_cpu_share": cpu / (now - self.t0),
                            # of the rest: waiting for a CPU (runnable, another thread on
                            # it); what remains is sleeping (the GIL, a file, a lock)
                            "loop_run_queue_share": rq / (now - self.t0),
                            "loop_minor_faults": faults,
                            # cores used, per thread of this process and by the whole
                            # machine (the producer and the kernel's writeback are the rest)
                            "cores_by_thread": threads, "machine_busy_cores": round(busy, 3),
                            **self.gc.take()})
        self.pause.set()
        try:
            cpu0, mine0, flt0 = time.process_time(), time.thread_time(), minor_faults()
            net, opt = self.bare_model
            r = workload.run_baseline(self.o["bare_window"], self.o["batch"], net, opt,
                                    batches=self.batches)
            others = (time.process_time() - cpu0) - (time.thread_time() - mine0)
            self.bare.append({"seconds": r["seconds"],
                              "records": round(r["records_per_s"] * r["seconds"]),
                              "loop_cpu_share": (time.thread_time() - mine0) / r["seconds"],
                              "loop_minor_faults": minor_faults() - flt0,
                              # CPU of this process's other threads meanwhile: ~0 when the
                              # bare window had the trainer's core to itself
                              "other_threads_cpu_s": others})
            self.gc.take()  # the bare window's collections: not the loop's
        finally:
            self.tasks.resume(held)
            self.pause.clear()
        self.t0, self.n0, self.cpu0 = time.monotonic(), self.n, time.thread_time()
        self.rq0, self.flt0 = run_queue_s(), minor_faults()
        self.threads0, self.busy0 = threads_cpu_s(), machine_busy_s()


def _rate(windows: list[dict]) -> float:
    return sum(w["records"] for w in windows) / sum(w["seconds"] for w in windows)


def _median_by_key(rows: list[dict[str, float]]) -> dict[str, float]:
    """The median of each key over ``rows`` (0 where a row lacks it)."""
    keys = {k for r in rows for k in r}
    return {k: round(statistics.median(r.get(k, 0.0) for r in rows), 3) for k in sorted(keys)}


def paired_ratios(on: list[dict], bare: list[dict]) -> list[float]:
    """Online window ``i`` (``i >= 1``; 0 is the warm-up) over the mean of the bare windows
    before and after it (``bare[i - 1]``, ``bare[i]``)."""
    def r(w: dict) -> float:
        return w["records"] / w["seconds"]

    return [r(on[i]) / ((r(bare[i - 1]) + r(bare[i])) / 2)
            for i in range(1, min(len(on), len(bare)))]


def bootstrap(on: list[dict], bare: list[dict], n: int = 2000, seed: int = 0) -> list[float]:
    """A 90 % interval of the total ratio, resampling whole cycles (online window ``i`` with
    the bare window after it)."""
    m = min(len(on), len(bare)) - 1  # cycles 1..m

    def ratio(pick):
        return _rate([on[i + 1] for i in pick]) / _rate([bare[i + 1] for i in pick])

    return harness.bootstrap(m, ratio, n=n, seed=seed)


def run(o: dict) -> dict:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(o["threads"])
    stream = ("criteo", o["new_frac"])
    net, opt, on_huge = built(o, stream)
    bnet, bopt, bare_huge = built(o, stream)
    batches = workload.bare_batches(stream, o["batch"], 100)
    workload.run_baseline(5.0, o["batch"], bnet, bopt, batches=batches)  # warm-up, not counted
    model = RecModel(net, nn.BCEWithLogitsLoss(), opt)
    pause = mp.get_context("spawn").Event()
    cycle = o["online_window"] + o["bare_window"]
    root = Path(tempfile.mkdtemp(prefix="lit_amp_bench_paired_"))
    print(f"[{o['vocab']:,}] {o['seconds']:.0f} s: online {o['online_window']:.0f} s / bare "
          f"{o['bare_window']:.0f} s ...", flush=True)
    try:
        with BackgroundTasks() as tasks:
            alt = Alternator(o, (bnet, bopt), batches, pause, tasks)
            thr = workload.run_online(
                root / "paired", seconds=o["seconds"], batch=o["batch"], rate=0.0,
                publish_every=o["publish_every"], warmup=0.0, model=model, stream=stream,
                ckpt_every=o["ckpt_every"] * cycle / o["online_window"],
                full_every=o["full_every"], publish={"delta": True}, delete_consumed=True,
                callbacks=(alt,), pause=pause, producer_nice=o["producer_nice"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    on, bare = alt.online, alt.bare
    per_cycle = paired_ratios(on, bare)
    counted = on[1:len(bare)]  # each with a bare window after it
    total = _rate(counted) / _rate(bare[:len(counted) + 1]) if counted else None
    return {
        "vocab": o["vocab"], "rows": 26 * o["vocab"], **workload.state_bytes(net, opt),
        "huge_page_fraction": {"online": on_huge, "bare": bare_huge},
        "online_records_per_s": _rate(counted) if counted else None,
        "bare_records_per_s": _rate(bare) if bare else None,
        "ratio": total,
        "ratio_interval_90": bootstrap(on, bare),
        "ratio_per_cycle": [round(r, 4) for r in per_cycle],
        "ratio_per_cycle_median": statistics.median(per_cycle) if per_cycle else None,
        # the loop thread over the counted online windows: on a CPU, and waiting for one
        "loop_cpu_share_median": statistics.median(w["loop_cpu_share"] for w in counted)
        if counted else None,
        "loop_run_queue_share_median": statistics.median(w["loop_run_queue_share"]
                                                         for w in counted) if counted else None,
        # the loop thread's minor page faults per 1,000 records: online and bare windows
        "loop_faults_per_1000_records": {
            k: 1000 * sum(w.get("loop_minor_faults", 0) for w in ws) /
            max(1, sum(w["records"] for w in ws)) for k, ws in (("online", counted),
                                                                ("bare", bare))},
        # cores used over the counted online windows (medians): per thread of this process,
        # and by the whole machine (the producer process and the kernel are the difference)
        "cores_by_thread_median": _median_by_key([w.get("cores_by_thread", {})
                                                  for w in counted]),
        "machine_busy_cores_median": statistics.median(w.get("machine_busy_cores", 0.0)
                                                       for w in counted) if counted else None,
        "online_windows": on, "bare_windows": bare,
        "checkpoint": workload._checkpoint_summary([thr]),
        "publish": workload._publish_summary(thr, o["publish_every"]),
        "stop_reason": thr["stop_reason"],
    }


def main() -> None:
    ap = parser(__doc__, doc_option=False)
    ap.add_argument("--vocab", type=int, default=1_000_000, help="rows per feature")
    ap.add_argument("--seconds", type=float, default=1200.0, help="the whole run")
    ap.add_argument("--online-window", type=float, default=40.0)
    ap.add_argument("--bare-window", type=float, default=20.0)
    ap.add_argument("--batch", type=int, default=workload.SCALE_BATCH)
    ap.add_argument("--ckpt-every", type=float, default=60.0, help="seconds of online time")
    ap.add_argument("--full-every", type=int, default=10)
    ap.add_argument("--publish-every", type=float, default=2.0)
    ap.add_argument("--new-frac", type=float, default=0.02)
    ap.add_argument("--optimizer", choices=("lazyadam", "adagrad"), default="lazyadam")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--producer-nice", type=int, default=0,
                    help="niceness of the producer process (it stands for a system elsewhere: "
                         "19 lets it run only on a core the trainer leaves free)")
    ap.add_argument("--wait-writes", dest="hold_writes", action="store_false",
                    help="at a window's end wait for the checkpoint / full-publish writes in "
                         "flight (counted as online time) instead of holding them between "
                         "chunks through the bare window (runs 1-16 waited)")
    ap.add_argument("--variant", default=None,
                    help="label a trial run in the history of bench/results/online_paired.json")
    o = vars(ap.parse_args())
    r = run(o)
    variant = o.pop("variant")
    runs = [h["run"] for h in load_history("online_paired") if "run" in h]
    if variant is None:  # a numbered run, for bench.online.pool
        r = {"run": max(runs, default=0) + 1, **r}
    path = write_result("online_paired", {"options": o, **r}, variant=variant)
    print(f"online {r['online_records_per_s']:,.0f}/s, bare {r['bare_records_per_s']:,.0f}/s: "
          f"ratio {r['ratio']:.3f} (90 % interval {r['ratio_interval_90']}), per-cycle median "
          f"{r['ratio_per_cycle_median']:.3f} over {len(r['ratio_per_cycle'])} cycles; loop "
          f"thread on a CPU {r['loop_cpu_share_median']:.3f}, waiting for one "
          f"{r['loop_run_queue_share_median']:.3f}; huge pages {r['huge_page_fraction']}; "
          f"loop thread's page faults per 1,000 records {r['loop_faults_per_1000_records']}; "
          f"cores by thread {r['cores_by_thread_median']}, machine busy "
          f"{r['machine_busy_cores_median']}")
    print("written:", path)


if __name__ == "__main__":
    main()
