"""Record the goldens: run every scenario's ms.py under real MindSpore, write goldens/<name>.json.

Usage (from the repository root)::

    python conformance/record.py [scenario ...]        # or: make conformance-record

The MindSpore interpreter is ``$MS_PYTHON``, else ``.ms-venv/bin/python``, else
``/work/ms-venv/bin/python``. Scenarios run one after the other (each in its own process, in
PyNative mode on CPU). A golden holds the MindSpore version and the observables as printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCEN = ROOT / "conformance" / "scenarios"
GOLD = ROOT / "conformance" / "goldens"


def ms_python() -> str:
    if os.environ.get("MS_PYTHON"):
        return os.environ["MS_PYTHON"]
    for cand in (ROOT / ".ms-venv" / "bin" / "python", Path("/work/ms-venv/bin/python")):
        if cand.exists():
            return str(cand)
    sys.exit("no MindSpore interpreter: set MS_PYTHON or run `make conformance-record`")


def scenarios() -> list[str]:
    return sorted(
        p.name for p in SCEN.iterdir() if (p / "ms.py").exists() and (p / "lit.py").exists()
    )


def record(name: str, py: str) -> dict:
    t0 = time.time()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3", "PYTHONHASHSEED": "0"}
    # a scratch cwd: ms.rewrite (O1) dumps rewritten_network/*.py into the working directory
    with tempfile.TemporaryDirectory() as scratch:
        proc = subprocess.run(
            [py, "-m", f"conformance.scenarios.{name}.ms"],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
        raise SystemExit(f"scenario {name}: MindSpore side failed (rc={proc.returncode})")
    obs = json.loads(proc.stdout.strip().splitlines()[-1])
    version = obs.pop("mindspore", None)
    golden = {
        "scenario": name,
        "mindspore": version,
        "mode": "PYNATIVE",
        "device": "CPU",
        "observables": obs,
    }
    path = GOLD / f"{name}.json"
    path.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    print(
        f"{name}: {len(obs)} observables, MindSpore {version}, {time.time() - t0:.1f}s -> "
        f"{path.relative_to(ROOT)}"
    )
    return golden


def main(argv: list[str]) -> None:
    GOLD.mkdir(exist_ok=True)
    py = ms_python()
    for name in argv or scenarios():
        record(name, py)


if __name__ == "__main__":
    main(sys.argv[1:])
