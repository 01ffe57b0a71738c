"""The bare step with the other core idle against the bare step beside the stream's producer.

bench/online/paired.py runs the producer process (it stands for the upstream system that
writes the stream) on the same 2-core machine as the trainer, during the online windows only:
the bare windows pause it. Whatever a busy neighbour costs a step on this machine (the shared
L3 cache and memory bandwidth, the hypervisor) therefore lands on the online side of that
ratio. This measures it on the bare step alone: on one 26 M-row model (LazyAdam, table and
moments on huge pages, one thread), ``--window`` seconds with the producer paused, then as
long with it writing one-batch ``.npz`` files at the bare step's own rate (the files are
removed between windows, not timed), ``--rounds`` times. Reports the per-round ratio
(producer running / paused) and its median; writes ``bench/results/cotenant.json``.

    .venv/bin/python -m bench.online.cotenant                 # 26 M rows, 12 rounds, ~8 min
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench._common import write_result
from bench.online import workload
from bench.online.workload import alternation_options, bare_model


def main() -> None:
    o = alternation_options(__doc__, rounds=12)
    net, opt, huge, stream = bare_model(o)
    batches = workload.bare_batches(stream, o["batch"], 100)
    warm = workload.run_baseline(5.0, o["batch"], net, opt, batches=batches)
    ctx = mp.get_context("spawn")
    root = Path(tempfile.mkdtemp(prefix="lit_amp_bench_cotenant_"))
    data = root / "data"
    data.mkdir()
    trained = ctx.Value("q", 0, lock=False)
    stop, ready, pause = ctx.Event(), ctx.Event(), ctx.Event()
    pause.set()
    prod = ctx.Process(target=workload.producer,
                       args=(str(data), o["batch"], warm["records_per_s"], 20, trained, stop,
                             ready, str(root / "lands.txt"), stream, pause), daemon=True)
    prod.start()
    ready.wait(timeout=300)
    rounds = []
    try:
        for i in range(o["rounds"]):
            a = workload.run_baseline(o["window"], o["batch"], net, opt, batches=batches)
            pause.clear()
            b = workload.run_baseline(o["window"], o["batch"], net, opt, batches=batches)
            pause.set()
            time.sleep(0.05)
            written = len(list(data.iterdir()))
            for f in data.iterdir():
                f.unlink()
            rounds.append({"alone": a["records_per_s"], "beside_producer": b["records_per_s"],
                           "files_written": written,
                           "ratio": b["records_per_s"] / a["records_per_s"]})
            print(f"round {i}: alone {a['records_per_s']:,.0f}/s, beside the producer "
                  f"{b['records_per_s']:,.0f}/s ({written} files): {rounds[-1]['ratio']:.3f}",
                  flush=True)
    finally:
        stop.set()
        prod.join(timeout=30)
        shutil.rmtree(root, ignore_errors=True)
    ratios = sorted(r["ratio"] for r in rounds)
    q = statistics.quantiles(ratios, n=4)
    r = {"options": o, "huge_page_fraction": huge, "producer_rate": warm["records_per_s"],
         "rounds": rounds, "ratio_median": statistics.median(ratios),
         "ratio_quartiles": [q[0], q[2]], "rounds_slower_beside": sum(x < 1 for x in ratios),
         "finished": time.strftime("%H:%M:%S")}
    print(f"beside / alone: median {r['ratio_median']:.3f} (quartiles {q[0]:.3f}, "
          f"{q[2]:.3f}); slower beside the producer in {r['rounds_slower_beside']} of "
          f"{len(rounds)} rounds")
    print("written:", write_result("cotenant", r))


if __name__ == "__main__":
    main()
