"""Huge pages for the embedding tables: the bare step of the 26 M-row Wide&Deep, side by side.

Two copies of ``python -m bench.online``'s scale model in one process (5.3 GB of state each): one
whose table and LazyAdam moments are allocated as torch does (4 KiB pages), one as lit_amp does
(:mod:`lit_amp.rec.huge_pages`). The bare step (no Lightning, no files, batch 4096, one thread)
alternates between them in short windows, so the machine's drift hits both alike; the result
is the median of the per-round ratios. Writes ``bench/results/huge_pages.json``.

    .venv/bin/python -m bench.online.huge_pages [--vocab 1000000] [--rounds 12] [--window 2]
"""

from __future__ import annotations

import statistics

import torch

from bench._common import parser, write_result
from bench.online import workload
from lit_amp.rec import huge_pages


def _model(vocab: int, huge: bool, batch: int, stream: tuple) -> tuple:
    advise = huge_pages._advise
    if not huge:
        huge_pages._advise = lambda t: None  # torch's own allocation
    try:
        net, opt = workload.scale_model(vocab, "lazyadam", False)
        workload.fault_in(net, opt, batch, stream)  # the moments exist and every page is touched
    finally:
        huge_pages._advise = advise
    w = net.embedding.weight
    pages = [huge_pages.huge_page_bytes(t)
             for t in (w, opt.state[w]["exp_avg"], opt.state[w]["exp_avg_sq"])]
    return net, opt, sum(pages)


def main() -> None:
    p = parser(__doc__, doc_option=False)
    p.add_argument("--vocab", type=int, default=1_000_000, help="rows per feature (26 features)")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--window", type=float, default=2.0, help="seconds per model and round")
    p.add_argument("--batch", type=int, default=workload.SCALE_BATCH)
    a = p.parse_args()
    torch.set_num_threads(1)
    stream = ("criteo", 0.02)
    models = {kind: _model(a.vocab, kind == "huge", a.batch, stream) for kind in ("plain", "huge")}
    rates: dict[str, list[float]] = {"plain": [], "huge": []}
    for kind in models:  # warm-up
        workload.run_baseline(a.window, a.batch, *models[kind][:2], stream, n_batches=100)
    for i in range(a.rounds):
        order = ("plain", "huge") if i % 2 == 0 else ("huge", "plain")
        for kind in order:
            r = workload.run_baseline(a.window, a.batch, *models[kind][:2], stream, n_batches=100)
            rates[kind].append(r["records_per_s"])
    ratios = [h / p for h, p in zip(rates["huge"], rates["plain"])]
    result = {
        "rows": 26 * a.vocab, "batch": a.batch, "threads": 1, "window_s": a.window,
        "rounds": a.rounds,
        "huge_page_bytes": {k: m[2] for k, m in models.items()},
        "records_per_s": rates,
        "median_records_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "ratios_huge_over_plain": ratios, "median_ratio": statistics.median(ratios),
    }
    print("written:", write_result("huge_pages", result))
    med = result["median_records_per_s"]
    print(f"bare step at {26 * a.vocab:,} rows: plain {med['plain']:,.0f}/s, huge pages "
          f"{med['huge']:,.0f}/s, paired ratio "
          f"{result['median_ratio']:.3f} (huge-page bytes: {result['huge_page_bytes']})")


if __name__ == "__main__":
    main()
