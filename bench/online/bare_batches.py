"""The bare step on fresh batches against the bare step cycling over a fixed 100.

The online loop trains each batch of the stream once; the bare step of bench/online and
bench/online/paired.py cycles over 100 batches made at its start. With power-law ids, a
fixed 410,000 records touch a fixed set of rare rows, which could sit in the caches on every
later pass, as the online loop's never do: a bare step faster than it would be on the
stream. This measures whether it is. Here the two alternate
on one 26 M-row model (LazyAdam, table and moments on huge pages, one thread): ``--window``
seconds over the same 100 batches, then as long over batches never trained before
(``online.FreshBatches``, made before the window starts), ``--rounds`` times. Reports the
per-round ratio fresh / recycled and its median; writes ``bench/results/bare_batches.json``.

    .venv/bin/python -m bench.online.bare_batches                 # 26 M rows, 15 rounds, ~8 min
"""

from __future__ import annotations

import statistics
import time

from bench._common import write_result
from bench.online import workload
from bench.online.workload import alternation_options, bare_model


def main() -> None:
    o = alternation_options(__doc__, rounds=15)
    net, opt, huge, stream = bare_model(o)
    recycled = workload.bare_batches(stream, o["batch"], 100)
    fresh = workload.FreshBatches(stream, o["batch"])
    workload.run_baseline(5.0, o["batch"], net, opt, batches=recycled)  # warm-up
    rounds, need = [], 150
    for i in range(o["rounds"]):
        batches = fresh.take(need)
        a = workload.run_baseline(o["window"], o["batch"], net, opt, batches=recycled)
        b = workload.run_baseline(o["window"], o["batch"], net, opt, batches=batches)
        need = max(need, int(1.3 * max(a["steps"], b["steps"])))
        rounds.append({"recycled": a["records_per_s"], "fresh": b["records_per_s"],
                       "fresh_steps": b["steps"], "fresh_batches": len(batches),
                       "ratio": b["records_per_s"] / a["records_per_s"]})
        print(f"round {i}: recycled {a['records_per_s']:,.0f}/s, fresh "
              f"{b['records_per_s']:,.0f}/s: {rounds[-1]['ratio']:.3f}", flush=True)
    ratios = sorted(r["ratio"] for r in rounds)
    q = statistics.quantiles(ratios, n=4)
    r = {"options": o, "huge_page_fraction": huge, "rounds": rounds,
         "ratio_median": statistics.median(ratios), "ratio_quartiles": [q[0], q[2]],
         "rounds_fresh_slower": sum(x < 1 for x in ratios),
         "fresh_ever_recycled": any(r["fresh_steps"] > r["fresh_batches"] for r in rounds),
         "finished": time.strftime("%H:%M:%S")}
    print(f"fresh / recycled: median {r['ratio_median']:.3f} (quartiles {q[0]:.3f}, "
          f"{q[2]:.3f}); fresh slower in {r['rounds_fresh_slower']} of {len(rounds)} rounds")
    print("written:", write_result("bare_batches", r))


if __name__ == "__main__":
    main()
