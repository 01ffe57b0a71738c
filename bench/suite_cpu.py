"""Where the test suite's CPU goes: a pytest plugin and its summary.

As a plugin (``PYTHONPATH=bench .venv/bin/python -m pytest -q -p suite_cpu``) it appends, per
test, the CPU seconds of the pytest process and of its waited-for children (``getrusage``) and
the wall time to ``$SUITE_CPU_OUT`` (default ``/tmp/suite_cpu.jsonl``). Children of the DDP
helper's forkserver and SLURM's jobs are not pytest's children and are not counted. Run as a
script on that file, it prints the totals and the largest files (docs/benchmarks.md, "The test
suite's wall time").
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time

import pytest

OUT = os.environ.get("SUITE_CPU_OUT", "/tmp/suite_cpu.jsonl")


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    s0, c0, t0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
    yield
    row = {"id": item.nodeid, "self": round(_cpu(resource.RUSAGE_SELF) - s0, 2),
           "children": round(_cpu(resource.RUSAGE_CHILDREN) - c0, 2),
           "wall": round(time.perf_counter() - t0, 2)}
    with open(OUT, "a") as f:
        f.write(json.dumps(row) + "\n")


def summary(path: str, top: int = 15) -> str:
    rows = [json.loads(line) for line in open(path)]
    own, child = sum(r["self"] for r in rows), sum(r["children"] for r in rows)
    lines = [f"{len(rows)} tests, {sum(r['wall'] for r in rows):.0f} s wall; CPU counted "
             f"{own + child:.0f} s: {child:.0f} in child processes, {own:.0f} in pytest"]
    by_file: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        acc = by_file[r["id"].split("::")[0]]
        acc[0] += r["self"] + r["children"]
        acc[1] += r["wall"]
        acc[2] += 1
    for name, (cpu, wall, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{cpu:7.1f} CPU-s {wall:7.1f} s wall {n:4d} tests  {name}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(sys.argv[1] if len(sys.argv) > 1 else OUT))
