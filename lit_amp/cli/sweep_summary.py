"""Summaries of ``lit-amp -m`` sweeps: a markdown table, JSON, and PNG plots.

After a sweep the Hydra callback :class:`SweepSummary` (``conf/hydra/default.yaml``) gathers
every job's ``result.json`` into ``summary.md``/``summary.json`` (and, with matplotlib,
``summary.png`` and ``curves.png``) in the sweep directory and prints the table; every job is
listed with its state (:mod:`lit_amp.cli.sweep_state`), a seed sweep also gets
:func:`seed_table`, and a failed job makes ``lit-amp`` exit with 1 (:data:`last_failures`).
By hand: ``python -m lit_amp.cli.sweep_summary <sweep dir>``.

Example:
    >>> rows = [{"overrides": ["amp=O0"], "status": "ok", "value": 0.9, "samples_per_sec": 1e4,
    ...          "optimized_metric": "acc", "metrics": {"acc": 0.9}}]
    >>> print(markdown_table(rows).splitlines()[0])
    | run | amp | state | acc | samples/s | wall s |
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lit_amp.cli import sweep_state

__all__ = [
    "all_jobs",
    "load_results",
    "markdown_table",
    "seed_table",
    "plot_curves",
    "summarize",
    "failures",
    "interrupted_exit",
    "last_failures",
    "SweepSummary",
    "main",
]

log = logging.getLogger(__name__)

#: the failed jobs (their directories) of the last sweep :class:`SweepSummary` summarized in
#: this process; ``lit-amp`` exits with status 1 when it is not empty
last_failures: list[str] = []


def _state(row: dict) -> str:
    """A row's state: done / failed / interrupted / not started (see :mod:`sweep_state`)."""
    if row.get("state"):
        return str(row["state"])
    status = row.get("status")
    return {"ok": "done", "interrupted": "interrupted"}.get(str(status), "failed")


def failures(rows: Sequence[dict]) -> list[str]:
    """The directories of the jobs that failed (not those interrupted or not started).

    Example:
        >>> failures([{"_dir": "0", "status": "ok"}, {"_dir": "1", "status": "failed"}])
        ['1']
    """
    return [str(r.get("_dir", "?")) for r in rows if _state(r) == "failed"]


def all_jobs(sweep_dir: str | Path) -> list[dict]:
    """Every job of the sweep with its ``state``: the ``result.json`` s, the jobs started
    without one, and (from ``sweep.json``) those never started.

    Example:
        >>> all_jobs("/nonexistent")
        []
    """
    manifest = sweep_state.load_manifest(sweep_dir)
    return sweep_state.job_states(manifest["jobs"] if manifest else None,
                                  load_results(sweep_dir), sweep_state.load_jobs(sweep_dir))


def load_results(sweep_dir: str | Path) -> list[dict]:
    """Read every ``<sweep_dir>/*/result.json`` (and deeper), ordered by job number.

    Example:
        >>> load_results("/nonexistent")
        []
    """
    root = Path(sweep_dir)
    if not root.is_dir():
        return []
    rows = []
    for path in root.rglob("result.json"):
        try:
            row = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            log.warning("skipping unreadable %s: %s", path, exc)
            continue
        row["_dir"] = str(path.parent.relative_to(root))
        rows.append(row)

    def order(r: dict) -> tuple:
        d = r["_dir"]
        return (0, int(d), "") if d.isdigit() else (1, 0, d)

    return sorted(rows, key=order)


def _swept_keys(rows: Sequence[dict]) -> list[str]:
    """Override keys whose values differ between runs (the sweep's axes)."""
    values: dict[str, set] = {}
    order: list[str] = []
    for r in rows:
        for o in r.get("overrides") or []:
            k, _, v = str(o).partition("=")
            k = k.lstrip("+~")
            if k not in values:
                values[k] = set()
                order.append(k)
            values[k].add(v)
    keys = [k for k in order if len(values[k]) > 1]
    return keys or order[:3]


def _label(row: dict, keys: Sequence[str]) -> str:
    ov = {}
    for o in row.get("overrides") or []:
        k, _, v = str(o).partition("=")
        ov[k.lstrip("+~")] = v
    parts = [f"{k}={ov[k]}" for k in keys if k in ov]
    return ", ".join(parts) or row.get("_dir", "?")


def _fmt(v: Any, digits: int = 4) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.{digits}f}" if abs(v) < 1e4 else f"{v:.0f}"
    return "" if v is None else str(v)


def markdown_table(rows: Sequence[dict]) -> str:
    """A markdown table: run, swept keys, status, the optimized metric, throughput, wall time."""
    keys = _swept_keys(rows)
    metric = next((r.get("optimized_metric") for r in rows if r.get("optimized_metric")), "value")
    head = ["run", *keys, "state", str(metric), "samples/s", "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        ov = {}
        for o in r.get("overrides") or []:
            k, _, v = str(o).partition("=")
            ov[k.lstrip("+~")] = v
        status = _state(r)
        error = str(r.get("error") or "").splitlines()[0][:60] if r.get("error") else ""
        if error.startswith("interrupted by "):
            status = f"{status} ({error.removeprefix('interrupted by ')})"
        elif status != "done" and error:
            status = f"{status}: {error}"
        cells = [
            r.get("_dir", ""),
            *(ov.get(k, "") for k in keys),
            status,
            _fmt(r.get("value")),
            _fmt(r.get("samples_per_sec"), 1),
            _fmt(r.get("wall_s"), 1),
        ]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def _overrides_of(row: dict) -> dict[str, str]:
    out = {}
    for o in row.get("overrides") or []:
        k, _, v = str(o).partition("=")
        out[k.lstrip("+~")] = v
    return out


def seed_table(rows: Sequence[dict], key: str = "seed") -> str | None:
    """Mean ± sample standard deviation of the metric over ``key`` (the seeds), per combination.

    Failed jobs are left out of the statistics and counted in the ``failed`` column; jobs
    interrupted or not started (an incomplete sweep) in a ``missing`` column.

    Args:
        rows: the sweep's results (:func:`load_results`).
        key: the override swept over repeats.

    Returns:
        A markdown table, or None when ``key`` is not swept.

    Example:
        >>> rows = [{"overrides": [f"amp={a}", f"seed={s}"], "status": "ok", "value": v,
        ...          "optimized_metric": "acc"}
        ...         for a, s, v in [("O0", 0, 0.8), ("O0", 1, 0.9), ("O2", 0, 0.7), ("O2", 1, 0.7)]]
        >>> print(seed_table(rows))
        | amp | acc (mean ± std over seed) | n | failed |
        |---|---|---|---|
        | O0 | 0.8500 ± 0.0707 | 2 | 0 |
        | O2 | 0.7000 ± 0.0000 | 2 | 0 |
    """
    keys = _swept_keys(rows)
    if key not in keys:
        return None
    others = [k for k in keys if k != key]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        ov = _overrides_of(r)
        groups.setdefault(tuple(ov.get(k, "") for k in others), []).append(r)
    metric = next((r.get("optimized_metric") for r in rows if r.get("optimized_metric")), "value")
    missing = any(_state(r) not in ("done", "failed") for r in rows)
    head = [*others, f"{metric} (mean ± std over {key})", "n", "failed",
            *(["missing"] if missing else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for combo, members in groups.items():
        vals = [float(r["value"]) for r in members
                if r.get("status") == "ok" and isinstance(r.get("value"), (int, float))
                and not math.isnan(float(r["value"]))]
        n = len(vals)
        mean = sum(vals) / n if n else math.nan
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else math.nan
        cell = f"{_fmt(mean)} ± {_fmt(std)}" if n else "no successful job"
        failed = sum(1 for r in members if _state(r) == "failed")
        gone = len(members) - n - failed
        cells = [*combo, cell, str(n), str(failed), *([str(gone)] if missing else [])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _read_curves(row: dict) -> dict[str, list[tuple[float, float]]]:
    """``metric -> [(step, value)]`` from the job's ``metrics.csv`` (CSVLogger), if any."""
    import csv

    log_dir = row.get("log_dir")
    path = Path(str(log_dir)) / "metrics.csv" if log_dir else None
    if path is None or not path.is_file():
        return {}
    curves: dict[str, list[tuple[float, float]]] = {}
    with path.open(newline="") as f:
        for rec in csv.DictReader(f):
            step = rec.get("step") or rec.get("epoch") or "0"
            for name, value in rec.items():
                if name in ("step", "epoch") or value in (None, "") or "samples_per_sec" in name:
                    continue
                try:
                    curves.setdefault(name, []).append((float(step), float(value)))
                except ValueError:
                    continue
    return curves


def plot_curves(rows: Sequence[dict], path: str | Path) -> Path | None:
    """Every job's learning curves (one panel per logged metric) from its ``metrics.csv``.

    Args:
        rows: the sweep's results (their ``log_dir`` holds the CSV logger's ``metrics.csv``).
        path: the PNG to write.

    Returns:
        ``path``, or None when matplotlib is missing or no job logged a curve.
    """
    curves = [(r, _read_curves(r)) for r in rows]
    names = sorted({n for _, c in curves for n in c})
    plt = _pyplot()
    if plt is None or not names:
        return None
    keys = _swept_keys(rows)
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        for r, c in curves:
            if name in c:
                xs, ys = zip(*c[name])
                ax.plot(xs, ys, marker="." if len(xs) < 30 else None, label=_label(r, keys))
        ax.set_title(name)
        ax.set_xlabel("step")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no plots (pip install lit_amp[plot]).")
        return None
    return plt


def _plot(rows: Sequence[dict], path: Path) -> Path | None:
    plt = _pyplot()
    if plt is None:
        return None
    keys = _swept_keys(rows)
    labels = [_label(r, keys) for r in rows]
    metric = next((r.get("optimized_metric") for r in rows if r.get("optimized_metric")), "value")
    vals = [r.get("value") if isinstance(r.get("value"), (int, float)) else 0.0 for r in rows]
    thr = [r.get("samples_per_sec") or 0.0 for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(rows) + 4), 4))
    axes[0].bar(range(len(rows)), vals, color="tab:blue")
    axes[0].set_title(f"{metric} (higher is better)")
    axes[1].bar(range(len(rows)), thr, color="tab:orange")
    axes[1].set_title("training throughput (samples/s)")
    for ax in axes:
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    for i, r in enumerate(rows):
        if _state(r) != "done":
            axes[0].annotate(_state(r), (i, 0), ha="center", va="bottom", color="red")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def summarize(sweep_dir: str | Path, *, plot: bool = True) -> str | None:
    """Write ``summary.md``, ``summary.json`` (and ``summary.png``) into ``sweep_dir``.

    Args:
        sweep_dir: the sweep directory (``hydra.sweep.dir``).
        plot: also draw ``summary.png`` when matplotlib is installed.

    Returns:
        The markdown table, or None when the directory holds no ``result.json``.
    """
    root = Path(sweep_dir)
    rows = all_jobs(root)
    if not rows:
        return None
    table = markdown_table(rows)
    by_seed = seed_table(rows)
    if by_seed is not None:
        table += f"\n\nOver seeds:\n\n{by_seed}"
    failed = failures(rows)
    if failed:
        table += f"\n\n{len(failed)} of {len(rows)} jobs FAILED: {', '.join(failed)}"
    incomplete = sweep_state.incomplete_line(rows)
    if incomplete:
        table += f"\n\n{incomplete[0].upper()}{incomplete[1:]}."
    (root / "summary.md").write_text(f"# lit-amp sweep: {root}\n\n{table}\n")
    (root / "summary.json").write_text(json.dumps(rows, indent=2, default=str))
    if plot:
        _plot(rows, root / "summary.png")
        plot_curves(rows, root / "curves.png")
    return table


try:  # Hydra's callback base (hydra-core >= 1.1)
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover
    _HydraCallback = object


class SweepSummary(_HydraCallback):
    """Hydra callback: summarize a ``-m`` sweep when it ends (see :func:`summarize`).

    Args:
        plot: draw ``summary.png`` when matplotlib is installed.

    Example:
        >>> SweepSummary().plot
        True
    """

    def __init__(self, plot: bool = True) -> None:
        self.plot = plot

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        """Write ``sweep.json``: every job of the sweep (see :mod:`sweep_state`)."""
        sweep_state.start_sweep(config)

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        """In a sweep, mark the job started (``<job>/job.json``)."""
        if str(config.hydra.get("mode", "")).endswith("MULTIRUN"):
            sweep_state.start_job(config)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        table = summarize(sweep_dir, plot=self.plot)
        last_failures[:] = failures(all_jobs(sweep_dir))
        if table is None:
            return
        print(f"\nlit-amp sweep summary ({sweep_dir}/summary.md):\n{table}", flush=True)


def interrupted_exit(exc: sweep_state.SweepInterrupted) -> SystemExit:
    """Summarize the interrupted sweep (every job's state), say how to resume; the exit."""
    where = sweep_state.current_sweep_dir
    table = None
    if where is not None:
        with contextlib.suppress(Exception):
            table = summarize(where, plot=False)
    if table is not None:
        print(f"\nlit-amp sweep summary ({where}/summary.md):\n{table}", flush=True)
    resume = (f"; run the same command with {sweep_state.RESUME_FLAG} to run the jobs that "
              "are not done" if where is not None else "")
    print(f"lit-amp: the sweep was interrupted by {exc.name}{resume}.", file=sys.stderr,
          flush=True)
    return SystemExit(128 + int(exc.signum))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lit_amp.cli.sweep_summary SWEEP_DIR``: (re)write and print a sweep's summary.

    Returns:
        0, or 1 when a job of the sweep failed or did not finish (or none wrote a result),
        2 on a usage error.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m lit_amp.cli.sweep_summary SWEEP_DIR", file=sys.stderr)
        return 2
    table = summarize(args[0])
    if table is None:
        print(f"no result.json under {args[0]}", file=sys.stderr)
        return 1
    print(table)
    rows = all_jobs(args[0])
    return 1 if failures(rows) or sweep_state.incomplete_line(rows) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

