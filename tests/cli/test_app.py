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

import pytest

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



def test_an_empty_checkpoint_to_eval_is_one_message_naming_the_file(tmp_path):
    """Issue #48 (18): ``mode=eval ckpt_path=<zero-byte file>`` ended in an IndexError."""
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    proc = _lit_amp(tmp_path, "data=synthetic", "mode=eval", f"ckpt_path={empty}",
                    f"hydra.run.dir={tmp_path}/r")
    assert proc.returncode == 1, proc.stderr
    assert f"ckpt_path='{empty}' is empty (0 bytes), not a checkpoint" in proc.stderr
    assert "Traceback" not in proc.stderr and "IndexError" not in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["data.batch_size=-1"], "'data.batch_size' must be an int >= 1, but got -1."),
    (["ckpt_path=/nonexistent"], "ckpt_path='/nonexistent' does not exist"),
    (["mode=eval", "ckpt_path=/nonexistent"], "ckpt_path='/nonexistent' does not exist"),
    (["mode=eval"], "mode=eval needs a checkpoint: ckpt_path=<file.ckpt>."),
    (["epochs=0"], "'epochs' must be >= 1, but got 0."),
])
def test_config_errors_that_need_no_torch_are_refused_before_torch_is_imported(
    tmp_path, args, message,
):
    """Issue #48 (21): these took 5-10 s (torch and Lightning imported first)."""
    proc = _lit_amp(tmp_path, "data=synthetic", *args, f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 1, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "torch imported: False" in proc.stderr
