"""What a checkpoint write costs the bare step beside it: through the page cache or around it.

A background checkpoint of the 26 M-row model writes gigabytes while the loop trains on the
other core. Here the bare step (one 26 M-row model, LazyAdam, table and moments on huge
pages, one thread) runs ``--window`` seconds with the other core idle, then as long beside a
thread writing row increments of the same table and moments over and over (a third of the
rows, gathered 16 MB at a time as the snapshot writer does, through ``atomic_write(...,
drop_cache=True)``): once through the page cache (fsync, then its pages evicted: lit_amp
before direct writes) and once around it (``O_DIRECT``, what ``drop_cache`` does now), the
order turning each round, ``--rounds`` times; the stream's producer writes beside all three
(``--no-producer``: not). Per kind of write: the bare step's records/s over the idle
windows' (median), the bytes written per second, the writer thread's cores, the loop seconds
lost per GB written and the writer's CPU seconds per GB. Writes
``bench/results/write_cost.json``.

    .venv/bin/python -m bench.online.write_cost                # 26 M rows, 5 rounds, ~5 min
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

import torch

from bench._common import write_result
from bench.online import workload
from bench.online.workload import alternation_parser, bare_model, machine_busy_s
from lit_amp import _io

#: kind of window -> (through the page cache, bytes gathered at a time, bytes staged for a
#: direct write); "idle": no writer
KINDS = {"idle": None, "cached": (True, 16 << 20, 8 << 20), "direct": (False, 16 << 20, 8 << 20),
         "direct_mid": (False, 2 << 20, 2 << 20), "direct_small": (False, 512 << 10, 1 << 20)}


class _Stopped(Exception):
    pass


class Writer(threading.Thread):
    """Writes row increments of ``tensors`` to ``folder`` until stopped (``kind``: cached or
    direct); counts the bytes and its own CPU time."""

    def __init__(self, kind: str, tensors: list[torch.Tensor], rows: torch.Tensor,
                 folder: Path) -> None:
        super().__init__(daemon=True)
        self.kind, self.tensors, self.rows, self.folder = kind, tensors, rows, folder
        self.cached, self.chunk, self.stage = KINDS[kind]
        self.stop = threading.Event()
        self.bytes = 0
        self.cpu_s = 0.0

    def fill(self, f) -> None:
        for t in self.tensors:
            step = self.chunk // (t.shape[1] * t.element_size())
            out = torch.empty(step, t.shape[1], dtype=t.dtype)
            for a in range(0, len(self.rows), step):
                if self.stop.is_set():
                    raise _Stopped
                rows = self.rows[a:a + step]
                buf = torch.index_select(t, 0, rows, out=out[:len(rows)])
                f.write(memoryview(buf.reshape(-1).view(torch.uint8).numpy()))
                self.bytes += buf.numel() * buf.element_size()

    def run(self) -> None:
        c0 = time.thread_time()
        cached = mock.patch.object(_io._DirectFile, "open", lambda fd: None)
        staged = mock.patch.object(_io._DirectFile, "STAGE", self.stage)
        with cached if self.cached else contextlib.nullcontext(), staged:
            k = 0
            while not self.stop.is_set():
                try:
                    _io.atomic_write(self.folder / f"inc{k}", self.fill, drop_cache=True)
                except _Stopped:
                    break
                (self.folder / f"inc{k}").unlink()
                k += 1
        self.cpu_s = time.thread_time() - c0


def main() -> None:
    ap = alternation_parser(__doc__, rounds=5)
    ap.add_argument("--no-producer", dest="producer", action="store_false")
    ap.add_argument("--kinds", nargs="+", choices=list(KINDS)[1:], default=["cached", "direct"],
                    help="the writes beside the bare step (each round also has an idle window)")
    ap.add_argument("--variant", default=None,
                    help="label a trial run in the history of bench/results/write_cost.json")
    o = vars(ap.parse_args())
    kinds = ["idle", *o["kinds"]]
    net, opt, huge, stream = bare_model(o)
    batches = workload.bare_batches(stream, o["batch"], 100)
    warm = workload.run_baseline(5.0, o["batch"], net, opt, batches=batches)
    table = max(net.parameters(), key=lambda p: p.numel())
    tensors = [table.detach(), *(v for v in opt.state[table].values()
                                 if torch.is_tensor(v) and v.shape == table.shape)]
    g = torch.Generator().manual_seed(0)
    rows = torch.sort(torch.randperm(len(table), generator=g)[: len(table) // 3]).values
    root = Path(tempfile.mkdtemp(prefix="lit_amp_bench_write_cost_"))
    prod = None
    if o["producer"]:
        ctx = mp.get_context("spawn")
        data = root / "data"
        data.mkdir()
        trained = ctx.Value("q", 0, lock=False)
        stop, ready, pause = ctx.Event(), ctx.Event(), ctx.Event()
        prod = ctx.Process(target=workload.producer,
                           args=(str(data), o["batch"], warm["records_per_s"], 20, trained,
                                 stop, ready, str(root / "lands.txt"), stream, pause),
                           daemon=True)
        prod.start()
        ready.wait(timeout=300)
    windows: dict[str, list[dict]] = {k: [] for k in kinds}
    try:
        for r in range(o["rounds"]):
            turn = r % len(kinds)
            for kind in kinds[turn:] + kinds[:turn]:
                w = Writer(kind, tensors, rows, root) if kind != "idle" else None
                busy0, t0 = machine_busy_s(), time.monotonic()
                if w:
                    w.start()
                b = workload.run_baseline(o["window"], o["batch"], net, opt, batches=batches)
                wall = time.monotonic() - t0
                if w:
                    w.stop.set()
                    w.join()
                busy = (machine_busy_s() - busy0) / wall
                windows[kind].append({
                    "records_per_s": b["records_per_s"],
                    "mb_per_s": (w.bytes if w else 0) / wall / 1e6,
                    "writer_cores": (w.cpu_s if w else 0.0) / wall,
                    "machine_busy_cores": busy})
                if prod is not None:
                    for f in data.iterdir():
                        f.unlink(missing_ok=True)
                print(f"round {r} {kind}: {b['records_per_s']:,.0f}/s, "
                      f"{windows[kind][-1]['mb_per_s']:.0f} MB/s written, writer "
                      f"{windows[kind][-1]['writer_cores']:.2f} cores, machine {busy:.2f}",
                      flush=True)
                time.sleep(1.0)
    finally:
        if prod is not None:
            stop.set()
            prod.join(timeout=30)
        shutil.rmtree(root, ignore_errors=True)
    idle = [w["records_per_s"] for w in windows["idle"]]
    summary = {}
    for kind in kinds[1:]:
        ws = windows[kind]
        ratio = statistics.median(w["records_per_s"] / i for w, i in zip(ws, idle))
        gb_s = statistics.median(w["mb_per_s"] for w in ws) / 1000
        cores = statistics.median(w["writer_cores"] for w in ws)
        summary[kind] = {"ratio_to_idle": ratio, "gb_per_s": gb_s, "writer_cores": cores,
                         "loop_s_lost_per_gb": (1 - ratio) / gb_s,
                         "writer_cpu_s_per_gb": cores / gb_s}
        print(f"{kind}: ratio {ratio:.3f}, {gb_s:.2f} GB/s, writer {cores:.2f} cores; loop "
              f"seconds lost per GB {(1 - ratio) / gb_s:.3f}, writer CPU s per GB "
              f"{cores / gb_s:.2f}")
    print("written:", write_result("write_cost", variant=o.pop("variant"), payload={
        "options": o, "huge_page_fraction": huge, "increment_bytes":
        len(rows) * sum(t.shape[1] * t.element_size() for t in tensors),
        "windows": windows, "summary": summary, "finished": time.strftime("%H:%M:%S")}))


if __name__ == "__main__":
    main()
