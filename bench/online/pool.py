"""The paired ratio of several ``python -m bench.online.paired`` runs taken together.

One 20-minute run has 19 cycles, and its 90 % interval is about +-0.015 wide: too wide to tell
0.905 from 0.895. Runs of the same code are independent samples of the same cycles, so their
cycles can be pooled. Reads the numbered runs in ``bench/results/online_paired.json``; chosen by
their number in that file (1-based, as docs/benchmarks.md numbers them). A cycle is online
window ``i`` (``i >= 1``; 0 is the warm-up) with the mean of the bare windows either side, as
``paired_ratios`` in paired.py. The pooled ratio is the sum of the cycles' online rates
over the sum of their bare rates (the windows are of equal length); the interval is a
bootstrap that resamples the cycles of each run within that run (2,000 draws), so every run
keeps its weight. Prints the result; ``--write`` stores it in the history of
``bench/results/online_paired.json`` (labelled ``pool``).

    .venv/bin/python -m bench.online.pool --runs 7 8 9 10
"""

from __future__ import annotations

import numpy as np

from bench._common import load_history, parser, write_result


def cycles(run: dict) -> np.ndarray:
    """``[[online rate, bare rate]]`` per cycle of one run (the bare rate: the mean of the two
    bare windows either side of the online window)."""
    on, bare = run["online_rates"], run["bare_rates"]
    return np.array([[on[i], (bare[i - 1] + bare[i]) / 2]
                     for i in range(1, min(len(on), len(bare)))], dtype=float)


def pooled(runs: list[dict], draws: int = 2000, seed: int = 0) -> dict:
    """The pooled ratio, its 90 % interval (stratified bootstrap) and the cycle count."""
    per_run = [cycles(r) for r in runs]
    both = np.concatenate(per_run)
    g = np.random.default_rng(seed)
    stats = []
    for _ in range(draws):
        pick = np.concatenate([c[g.integers(0, len(c), len(c))] for c in per_run])
        stats.append(pick[:, 0].sum() / pick[:, 1].sum())
    return {"ratio": float(both[:, 0].sum() / both[:, 1].sum()),
            "ratio_interval_90": [float(np.quantile(stats, 0.05)),
                                  float(np.quantile(stats, 0.95))],
            "cycles": len(both),
            "cycles_below_0.9": int((both[:, 0] / both[:, 1] < 0.9).sum())}


def main() -> None:
    ap = parser(__doc__, doc_option=False)
    ap.add_argument("--runs", type=int, nargs="+", required=True,
                    help="run numbers in the history of bench/results/online_paired.json")
    ap.add_argument("--write", action="store_true",
                    help="store it in the history of bench/results/online_paired.json")
    a = ap.parse_args()
    every = {h["run"]: h for h in load_history("online_paired") if "run" in h}
    bad = [n for n in a.runs if n not in every]
    if bad:
        ap.error(f"--runs: {bad} not among the stored runs {sorted(every)}")
    chosen = [every[n] for n in a.runs]
    r = {"runs": a.runs, "commits": [c["commit"] for c in chosen], **pooled(chosen)}
    print(f"runs {a.runs}: pooled ratio {r['ratio']:.4f}, 90 % interval "
          f"{r['ratio_interval_90'][0]:.4f}-{r['ratio_interval_90'][1]:.4f} over {r['cycles']} "
          f"cycles ({r['cycles_below_0.9']} below 0.9)")
    if a.write:
        print("written:", write_result("online_paired", r, variant="pool"))


if __name__ == "__main__":
    main()
