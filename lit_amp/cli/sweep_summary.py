"""Summaries of ``lit-amp -m`` sweeps: a markdown table, JSON, and a PNG plot.

Each job of a sweep writes ``result.json`` in its directory (``lit_amp.cli.run``). After the sweep,
the Hydra callback :class:`SweepSummary` (configured in ``conf/hydra/default.yaml``) gathers them
into ``summary.md``, ``summary.json`` and — when matplotlib is installed — ``summary.png``
(accuracy and throughput per option) in the sweep directory, and prints the table. The same can
be done by hand::

    python -m lit_amp.cli.sweep_summary runs/train/multirun/2026-01-01_12-00-00

Example:
    >>> rows = [{"overrides": ["amp=O0"], "status": "ok", "value": 0.9, "samples_per_sec": 1e4,
    ...          "optimized_metric": "acc", "metrics": {"acc": 0.9}}]
    >>> print(markdown_table(rows).splitlines()[0])
    | run | amp | status | acc | samples/s | wall s |
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["load_results", "markdown_table", "summarize", "SweepSummary", "main"]

log = logging.getLogger(__name__)


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
    head = ["run", *keys, "status", str(metric), "samples/s", "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        ov = {}
        for o in r.get("overrides") or []:
            k, _, v = str(o).partition("=")
            ov[k.lstrip("+~")] = v
        status = r.get("status", "?")
        if status != "ok" and r.get("error"):
            status = f"{status}: {str(r['error']).splitlines()[0][:60]}"
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


def _plot(rows: Sequence[dict], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
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
        if r.get("status") != "ok":
            axes[0].annotate("failed", (i, 0), ha="center", va="bottom", color="red")
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
    rows = load_results(root)
    if not rows:
        return None
    table = markdown_table(rows)
    (root / "summary.md").write_text(f"# lit-amp sweep: {root}\n\n{table}\n")
    (root / "summary.json").write_text(json.dumps(rows, indent=2, default=str))
    if plot:
        _plot(rows, root / "summary.png")
    return table


try:  # Hydra's callback base (hydra-core >= 1.1)
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover
    _HydraCallback = object  # type: ignore[assignment,misc]


class SweepSummary(_HydraCallback):  # type: ignore[misc,valid-type]
    """Hydra callback: summarize a ``-m`` sweep when it ends (see :func:`summarize`).

    Args:
        plot: draw ``summary.png`` when matplotlib is installed.

    Example:
        >>> SweepSummary().plot
        True
    """

    def __init__(self, plot: bool = True) -> None:
        self.plot = plot

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        table = summarize(sweep_dir, plot=self.plot)
        if table is None:
            return
        print(f"\nlit-amp sweep summary ({sweep_dir}/summary.md):\n{table}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lit_amp.cli.sweep_summary SWEEP_DIR``: (re)write and print a sweep's summary."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m lit_amp.cli.sweep_summary SWEEP_DIR", file=sys.stderr)
        return 2
    table = summarize(args[0])
    if table is None:
        print(f"no result.json under {args[0]}", file=sys.stderr)
        return 1
    print(table)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
