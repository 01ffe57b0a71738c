"""Packaging (issue #28, items 1 and 5): the wheel builds without a deprecation warning and
declares what the default experiment needs; the declared torch range is capped at the newest
torch the suite has passed on (issue #48, item 19).

Setuptools stops supporting ``project.license`` as a TOML table on 2027-02-18 and warns on
every build until then; a build log with any deprecation warning fails here.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

DEPRECATION = re.compile(r"deprecat|BuildBackendWarning|SetuptoolsWarning|no longer be supported",
                         re.IGNORECASE)


def test_the_wheel_builds_without_a_deprecation_warning(lit_amp_wheel):
    _, log = lit_amp_wheel
    assert "Building wheel for lit_amp" in log  # the backend's output is in the log
    warned = [line.strip() for line in log.splitlines() if DEPRECATION.search(line)]
    assert not warned, "the build warns:\n" + "\n".join(warned[:10])


def test_the_wheels_metadata_has_the_spdx_license_and_the_demo_data_dependency(lit_amp_wheel):
    path, _ = lit_amp_wheel
    with zipfile.ZipFile(path) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))
    lines = meta.decode().splitlines()
    assert "License-Expression: Apache-2.0" in lines
    # a plain install runs `lit-amp`'s default experiment: MNIST-1D is not an extra
    core = [ln for ln in lines if ln.startswith("Requires-Dist:") and "extra ==" not in ln]
    assert any(ln.split()[1].startswith("mnist1d") for ln in core), core


def _torch_requirement() -> Requirement:
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    return next(r for r in map(Requirement, project["project"]["dependencies"])
                if r.name == "torch")


def test_the_torch_range_is_capped_and_holds_the_suites_torch():
    spec = _torch_requirement().specifier
    assert any(s.operator == "<" for s in spec), "torch has no upper bound"
    installed = Version(md.version("torch")).base_version
    assert spec.contains(installed), f"torch {installed} is outside {spec}"
    assert not spec.contains("2.14.1")  # the newest release, never tested
