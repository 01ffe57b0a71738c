"""Shared helpers for the benchmarks: machine description, interleaved timing, result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def free_port() -> int:
    """A free TCP port on localhost (for a gloo process group's MASTER_PORT)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine() -> dict:
    """CPU model, core count, torch version and threads: recorded with every result."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def interleaved(variants: dict[str, Callable[[], None]], repeats: int, warmup: int = 1) -> dict:
    """Run every variant ``warmup`` times, then ``repeats`` rounds in rotating order.

    Returns ``{name: [seconds, ...]}`` (warm-up excluded).
    """
    names = list(variants)
    for _ in range(warmup):
        for n in names:
            variants[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            t0 = time.perf_counter()
            variants[n]()
            times[n].append(time.perf_counter() - t0)
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {n: statistics.median(v) for n, v in times.items()}


def write_result(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {
        "benchmark": name,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        **payload,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
