"""The ``lit-amp`` command (``lit_amp.cli.app``): an error ends it at once, a missing package is
found before torch is imported, and the process ends without finalizing every module (atexit
handlers still run).

The timings are in docs/benchmarks.md ("Error exit"); these tests check the behaviour only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# the console script's path (main() with argv=None), with mnist1d unimportable and a report,
# from an atexit handler, of whether torch had been imported
_SCRIPT = """
import atexit, sys
sys.modules["mnist1d"] = None
atexit.register(lambda: print("torch imported:", "torch" in sys.modules, file=sys.stderr))
sys.argv = ["lit-amp", *sys.argv[1:]]
from lit_amp.cli import main
sys.exit(main())
"""


def _lit_amp(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", _SCRIPT, *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_missing_package_is_reported_before_torch_is_imported(tmp_path):
    proc = _lit_amp(tmp_path, "data=mnist1d", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 1, proc.stderr
    assert "'data' (lit_amp.demos.mnist1d_loaders) needs the package 'mnist1d'" in proc.stderr
    assert "pip install lit_amp (it is a dependency)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "torch imported: False" in proc.stderr  # and the atexit handlers ran

