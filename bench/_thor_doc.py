"""The THOR section of docs/benchmarks.md, written by ``bench/thor.py`` from its payload
(``bench/results/thor.json``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

MODELS = ("mlp", "cnn")
ORDER = ["sgd", "adam", "asdl", "asdl10", "kfac", "thor"]


def _f(x: Any, nd: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "never" if math.isinf(x) else f"{x:.{nd}f}"
    return str(x)


def anchor_table(payload: dict) -> str:
    """Epochs / time to target, ratio to the best library K-FAC, final acc, inversions, ms/step."""
    s, tm = payload["summary"], payload["timing_ms_per_step"]
    lines = ["| model / optimizer | epochs to target | reached | time to target (s) | "
             "ratio to best ASDL | final acc | inversions | ms/step 1 thr (CPU) | "
             "ms/step 1 thr | ms/step 2 thr |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m in MODELS:
        libs = [s[f"{m}/{v}"]["time_to_target_s_median"] for v in ("asdl", "asdl10")
                if f"{m}/{v}" in s]
        best = min(libs) if libs else None
        for v in ORDER:
            r = s.get(f"{m}/{v}")
            if r is None:
                continue
            t = r["time_to_target_s_median"]
            ratio = None if best is None or math.isinf(best) else t / best
            ms = [tm.get(k, {}).get(m, {}).get(v) for k in ("threads1_cpu", "threads1", "threads2")]
            lines.append(
                f"| {m}/{v} | {_f(r['epochs_to_target_median'], 1)} | "
                f"{r['reached_target']}/{len(r['seeds'])} | {_f(t)} | {_f(ratio)} | "
                f"{_f(r['final_acc_median'], 3)} | {_f(r['inversions_median'], 0)} | "
                f"{_f(ms[0])} | {_f(ms[1])} | {_f(ms[2])} |")
    return "\n".join(lines)


def section(payload: dict, table: Callable[[dict, list[str]], str], labels: dict) -> str:
    """The report's THOR section: what is compared, the machine, the table and the targets.

    The run's details (per-seed spread, diagnosis rows, matrix splitting, step profile,
    threads) stay in ``bench/results/thor.json``.
    """
    m, t = payload["machine"], payload["targets"]
    s = payload["summary"]
    env = payload.get("environment", {})
    rows = "; ".join(f"`{k}`: {v}" for k, v in labels.items()
                     if any(f"{mm}/{k}" in s for mm in MODELS))
    out = [
        "## THOR vs a K-FAC library (ASDL), SGD and Adam on MNIST-1D (`bench/thor.py`)",
        "",
        "Time and epochs to a target accuracy (MLP 65 %, CNN 90 %), medians over seeds "
        f"{payload['seeds']}; second-order methods 20 epochs, Adam/SGD 100 (MLP) / 40 (CNN); "
        "same data, batch 100, init and data order for every method; hyperparameters tuned "
        "on seeds 100-103 with one rule for all. "
        f"Rows: {rows}.",
        "",
        f"Command: `.venv/bin/python bench/thor.py` (the `bench` extra: `asdfghjkl==0.1a5`). "
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, "
        f"{payload.get('threads', 1)} thread; load average at the start "
        f"{env.get('load_average_start', 'not recorded')}; {payload['date']}.",
        "",
        anchor_table(payload),
        "",
        "| target | value | met |",
        "|---|---|---|",
    ]
    for k, v in t.items():
        val = ", ".join(f"{kk}={_f(vv, 3)}" for kk, vv in v.items() if kk != "met")
        out.append(f"| {k} | {val} | {'yes' if v['met'] else '**no**'} |")
    return "\n".join(out) + "\n"
