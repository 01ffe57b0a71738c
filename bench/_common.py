"""The benchmarks' one harness: the machine, interleaved timing, targets, results and the report.

- :func:`machine`: what decides the numbers, recorded with every result;
- :func:`measure`: every variant in rotating order, round after round; a :class:`Measurement`
  gives the rounds, each variant's per-round ratio to the baseline (paired: a drift of the
  machine hits both sides of a round alike) and a bootstrap interval of that ratio;
- :func:`parser`: the options every script shares (``--no-doc``);
- :class:`Target`: a target as data; :func:`check_targets` prints each one met or missed;
- :func:`write_result`: ``bench/results/<name>.json``, the latest run at the top level and the
  earlier ones under ``"history"``;
- :func:`splice`: a script's section of docs/benchmarks.md, between
  ``<!-- bench:<name>:start -->`` and ``<!-- bench:<name>:end -->``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
#: where results go and which report is spliced; ``BENCH_RESULTS`` and ``BENCH_DOC`` point a
#: smoke run elsewhere
RESULTS = Path(os.environ.get("BENCH_RESULTS") or ROOT / "bench" / "results")
DOC = Path(os.environ.get("BENCH_DOC") or ROOT / "docs" / "benchmarks.md")


def free_port() -> int:
    """A free TCP port on localhost (for a gloo process group's MASTER_PORT)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: ``lightning.Trainer`` flags for a run that logs, saves and prints nothing
QUIET_TRAINER = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                 "enable_model_summary": False, "num_sanity_val_steps": 0}


def cpu_model() -> str:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return cpu


def machine() -> dict:
    """CPU model, core count, torch version and threads: recorded with every result."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


# ----------------------------------------------------------------------------- timing
def bootstrap(cycles: int, stat: Callable[[np.ndarray], float], n: int = 2000, seed: int = 0,
              level: float = 0.9) -> list[float]:
    """A ``level`` interval of ``stat(picked cycle indices)``, resampling whole cycles.

    ``[]`` when there are fewer than 3 cycles.
    """
    if cycles < 3:
        return []
    g = np.random.default_rng(seed)
    stats = [stat(g.choice(cycles, cycles)) for _ in range(n)]
    tail = (1 - level) / 2
    return [float(np.quantile(stats, tail)), float(np.quantile(stats, 1 - tail))]


@dataclass
class Measurement:
    """Seconds per round and variant, in the order they ran; ``baseline`` is the reference."""

    rounds: dict[str, list[float]]
    baseline: str

    def medians(self) -> dict[str, float]:
        return {n: statistics.median(v) for n, v in self.rounds.items()}

    def ratios(self, name: str) -> list[float]:
        """``name``'s time over the baseline's, round by round."""
        return [a / b for a, b in zip(self.rounds[name], self.rounds[self.baseline])]

    def interval(self, name: str, level: float = 0.9) -> list[float]:
        """A bootstrap interval of ``name``'s total time over the baseline's."""
        a, b = np.asarray(self.rounds[name]), np.asarray(self.rounds[self.baseline])
        return bootstrap(len(a), lambda i: float(a[i].sum() / b[i].sum()), level=level)

    def summary(self) -> dict:
        return {"rounds": self.rounds, "baseline": self.baseline, "median_s": self.medians(),
                "median_ratio": {n: statistics.median(self.ratios(n)) for n in self.rounds},
                "ratio_interval_90": {n: self.interval(n) for n in self.rounds}}


def measure(variants: dict[str, Callable[[], None]], rounds: int, warmup: int = 1,
            baseline: str | None = None) -> Measurement:
    """Run every variant ``warmup`` times, then ``rounds`` rounds in rotating order."""
    names = list(variants)
    for _ in range(warmup):
        for n in names:
            variants[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            variants[n]()
            times[n].append(time.perf_counter() - t0)
    return Measurement(times, baseline or names[0])


# ----------------------------------------------------------------------------- options
def parser(doc: str | None, *, doc_option: bool = True, raw_text: bool = False,
           **options: object) -> argparse.ArgumentParser:
    """The scripts' argument parser: the module docstring as help, and ``--no-doc``
    (``raw_text``: the options' help keeps its line breaks too).

    ``options`` declares plain options as data: ``work_ms=8.0`` is ``--work-ms`` (a float,
    default 8.0); a list default takes one or more values of its elements' type.
    """
    fmt = argparse.RawTextHelpFormatter if raw_text else argparse.RawDescriptionHelpFormatter
    ap = argparse.ArgumentParser(description=doc, formatter_class=fmt)
    if doc_option:
        ap.add_argument("--no-doc", action="store_true",
                        help="leave docs/benchmarks.md as it is")
    for name, default in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, list):
            ap.add_argument(flag, type=type(default[0]), nargs="+", default=default)
        else:
            ap.add_argument(flag, type=type(default), default=default)
    return ap


# ----------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class Target:
    """``name`` must be ``op`` (``>=`` or ``<=``) ``goal``."""

    name: str
    op: str
    goal: float

    def check(self, value: float | None) -> dict:
        """The target's record; a missing value (a failed variant) counts as missed."""
        met = value is not None and (value >= self.goal if self.op == ">=" else value <= self.goal)
        return {"name": self.name, "value": value, "target": f"{self.op} {self.goal:g}",
                "met": bool(met)}


def fmt(v: float | None, digits: int = 3) -> str:
    return "failed" if v is None else f"{v:.{digits}f}"


def check_targets(targets: Sequence[Target], values: dict[str, float | None],
                  echo: bool = True) -> list[dict]:
    """Each target's record, printed ``met``/``MISSED`` unless ``echo`` is false."""
    records = [t.check(values.get(t.name)) for t in targets]
    if echo:
        for r in records:
            print(f"target {r['name']} {r['target']}: {fmt(r['value'])} "
                  f"{'met' if r['met'] else 'MISSED'}")
    return records


def targets_table(records: list[dict]) -> list[str]:
    lines = ["| target | value | wanted | met |", "|---|---:|---:|---|"]
    for t in records:
        lines.append(f"| {t['name']} | {fmt(t['value'])} | {t['target']} | "
                     f"{'yes' if t['met'] else 'NO'} |")
    return lines


# ----------------------------------------------------------------------------- results
def _read(name: str) -> dict:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def load_result(name: str, variant: str | None = None) -> dict:
    """The latest run of ``name`` (its history left out), or its latest run labelled
    ``variant``; ``{}`` when there is none."""
    data = _read(name)
    history = data.pop("history", [])
    if variant is None:
        return data
    return next((h for h in reversed(history) if h.get("variant") == variant), {})


def load_history(name: str) -> list[dict]:
    """Every stored run of ``name``, oldest first, the latest last."""
    data = _read(name)
    history = data.pop("history", [])
    return [*history, data] if data else history


def write_result(name: str, payload: dict, machine_info: dict | None = None,
                 variant: str | None = None) -> Path:
    """``bench/results/<name>.json``: this run on top, the earlier ones under ``"history"``.

    A run labelled ``variant`` (a smoke run, a tuning grid, a setting tried) is appended to the
    history and leaves the latest run on top.
    """
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    data = _read(name)
    history = data.pop("history", [])
    run = {"benchmark": name, "machine": machine_info or machine(),
           "date": time.strftime("%Y-%m-%d"),
           "time": datetime.now().isoformat(timespec="microseconds"), **payload}
    if variant is not None:
        history.append({"variant": variant, **run})
    else:
        if data:
            history.append(data)
        data = run
    history.sort(key=lambda h: h.get("time") or h.get("date") or "")  # oldest first
    path.write_text(json.dumps({**data, "history": history}, indent=2, default=str) + "\n")
    return path


# ----------------------------------------------------------------------------- report
def splice(name: str, body: str, after: str | None = None, doc: Path = DOC) -> None:
    """Replace the ``name`` section of ``doc``; other sections are left as they are.

    An absent section goes right after the ``after`` section when that exists, else at the end.
    """
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    block = f"{start}\n{body.strip()}\n{end}\n"
    old = doc.read_text() if doc.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end) + r"\n?", re.S)
    anchor = f"<!-- bench:{after}:end -->\n" if after else None
    if pattern.search(old):
        new = pattern.sub(lambda _: block, old, count=1)
    elif anchor and anchor in old:
        new = old.replace(anchor, anchor + "\n" + block, 1)
    else:
        new = old.rstrip("\n") + "\n\n" + block
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(new)
    print(f"updated: {doc} ({name})")


def compute_for(ms: float, n: int = 128) -> None:
    """Busy the CPU with ``n x n`` matmuls for ``ms`` milliseconds (a stand-in for a step)."""
    t = time.perf_counter()
    a = torch.randn(n, n)
    while (time.perf_counter() - t) * 1e3 < ms:
        a = a @ a
        a = a / a.norm()
