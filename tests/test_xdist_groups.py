"""Tests sharing a wider-scoped fixture of the suite land in one pytest-xdist group (the hook
of tests/conftest.py; ``make gpu-check`` runs the suite with ``-n <cores> --dist loadgroup``):
the fixture is then set up once, on one worker, not once per worker."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _groups(*paths: str) -> dict[str, str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "tests.helpers.xdist_groups", *paths],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln.split(" ", 2) for ln in proc.stdout.splitlines() if ln.startswith("GROUP ")]
    return {nodeid: group for _, group, nodeid in lines}


@pytest.fixture(scope="module")
def groups() -> dict[str, str]:
    return _groups("tests/test_readme_commands.py", "tests/cluster", "tests/cli/test_wheel.py",
                   "tests/test_packaging.py", "tests/test_io.py")


def test_tests_sharing_a_module_package_or_session_fixture_share_a_group(groups):
    by_group = defaultdict(set)
    for nodeid, group in groups.items():
        by_group[group].add(nodeid.split("::")[0])
    readme = {g for n, g in groups.items() if n.startswith("tests/test_readme_commands.py")}
    # the README's command session (module scope) is set up once: its 8 tests in one group;
    # the module's 3 tests that do not use it are free
    assert readme == {"module:tests/test_readme_commands.py", "-"}
    assert sum(g == "module:tests/test_readme_commands.py" for g in groups.values()) == 8
    # every test of the SLURM cluster (package scope) and its runs: one group
    slurm = {g for n, g in groups.items()
             if n.startswith("tests/cluster/test_slurm_")}
    assert slurm == {"package:tests/cluster"}
    # the one wheel build (session scope) for the packaging and wheel tests
    assert by_group["session:tests"] >= {"tests/cli/test_wheel.py", "tests/test_packaging.py"}


def test_tests_without_a_shared_fixture_are_free(groups):
    io = {g for n, g in groups.items() if n.startswith("tests/test_io.py")}
    assert io == {"-"}
