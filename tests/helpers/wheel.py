"""lit_amp's wheel, built offline from a copy of the sources: the one build the packaging and
wheel-install tests share (the ``lit_amp_wheel`` fixture of tests/conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(dest: Path) -> tuple[Path, str]:
    """Build lit_amp's wheel from a copy of the sources (offline: this venv's setuptools).

    Returns:
        The wheel and the whole build log (the backend's output included: ``-v``).
    """
    src = dest / "src"  # a copy: the build writes build/ and *.egg-info next to its sources
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "lit_amp", src / "lit_amp",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    dist = dest / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check",
                           "--no-input", "wheel", "-v", "--no-deps", "--no-build-isolation",
                           "-w", str(dist), str(src)],
                          capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    return next(dist.glob("lit_amp-*.whl")), log
