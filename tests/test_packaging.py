"""Packaging (issue #28, items 1 and 5): the wheel builds without a deprecation warning and
declares what the default experiment needs.

Setuptools stops supporting ``project.license`` as a TOML table on 2027-02-18 and warns on
every build until then; a build log with any deprecation warning fails here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEPRECATION = re.compile(r"deprecat|BuildBackendWarning|SetuptoolsWarning|no longer be supported",
                         re.IGNORECASE)


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


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, str]:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_builds_without_a_deprecation_warning(wheel):
    _, log = wheel
    assert "Building wheel for lit_amp" in log  # the backend's output is in the log
    warned = [line.strip() for line in log.splitlines() if DEPRECATION.search(line)]
    assert not warned, "the build warns:\n" + "\n".join(warned[:10])


def test_the_wheels_metadata_has_the_spdx_license_and_the_demo_data_dependency(wheel):
    path, _ = wheel
    with zipfile.ZipFile(path) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))
    lines = meta.decode().splitlines()
    assert "License-Expression: Apache-2.0" in lines
    # a plain install runs `lit-amp`'s default experiment: MNIST-1D is not an extra
    core = [ln for ln in lines if ln.startswith("Requires-Dist:") and "extra ==" not in ln]
    assert any(ln.split()[1].startswith("mnist1d") for ln in core), core
