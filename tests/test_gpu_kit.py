"""The GPU kit, checked where there is no GPU: the wheel list, gpu-check's refusal and its
environment, the results' round trip into the docs, the declared version range."""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from gpu import check, report, wheels

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# what the GPU machine runs: lit_amp (the demo data included) and its tests (dev)
NEEDED = [*PYPROJECT["project"]["dependencies"],
          *PYPROJECT["project"]["optional-dependencies"]["dev"]]
GPU_MARKERS = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
               "sys_platform": "linux", "platform_machine": "x86_64", "extra": ""}


def _closure(requirements: list[str]) -> set[str]:
    """Every distribution the requirements pull in on the GPU machine, following installed
    metadata, stopping at what the image holds."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate(GPU_MARKERS):
            continue
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        if name in wheels.IMAGE_HAS or name in wheels.NOT_NEEDED:
            continue
        todo += [Requirement(r) for r in md.requires(name) or []]
    return seen


def test_the_wheels_and_the_image_cover_every_requirement_followed_through_its_own():
    covered = set(wheels.IMAGE_HAS) | set(wheels.WHEELS) | set(wheels.NOT_NEEDED)
    missing = sorted(_closure(NEEDED) - covered)
    assert not missing, f"add to gpu/wheels.py's WHEELS (or IMAGE_HAS): {missing}"
    # and nothing downloaded for nothing
    assert set(wheels.WHEELS) <= _closure(NEEDED)


def test_each_pinned_wheel_satisfies_pyprojects_requirement():
    for spec in NEEDED:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        if name in wheels.WHEELS:
            assert req.specifier.contains(wheels.WHEELS[name]), (spec, wheels.WHEELS[name])


def test_lower_bounds_name_the_oldest_tested_version():
    cpu = {n: Version(md.version(n)).base_version for n in ("torch", "lightning", "torchmetrics")}
    for spec in PYPROJECT["project"]["dependencies"]:
        req = Requirement(spec)
        if req.name in cpu:
            (lower,) = [s.version for s in req.specifier if s.operator == ">="]
            oldest = min(Version(cpu[req.name]), Version(wheels.IMAGE_HAS[req.name]))
            assert Version(lower) == oldest, f"{spec}: the oldest tested is {oldest}"


def test_gpu_check_refuses_clearly_where_no_cuda_device_is_visible(tmp_path):
    out = subprocess.run(["make", "-s", "gpu-check", f"GPU_PY={sys.executable}"], cwd=REPO,
                         capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "GPU_OUT": str(tmp_path),
                              "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no CUDA device is visible" in out.stderr
    assert "make test" in out.stderr and "make gpu-wheels" in out.stderr
    assert not list(tmp_path.iterdir())  # nothing was set up or written


def test_gpu_check_refuses_a_python_without_torch():
    with pytest.raises(SystemExit) as e:
        check.check_cuda({"error": "cannot import torch: ModuleNotFoundError('torch')"}, "py")
    assert e.value.code == 2


@pytest.mark.slow
def test_the_environment_gpu_check_builds_runs_lit_amp_from_this_checkout(tmp_path):
    # this machine's venv stands in for the GPU image: its packages come in through a .pth
    info = check.probe(sys.executable)
    vpy = check.make_env(sys.executable, info, tmp_path / "venv", tmp_path / "no-wheels")
    where = subprocess.run([str(vpy), "-c", "import lit_amp, hydra, sys; "
                            "print(lit_amp.__file__); print(sys.prefix)"],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    assert where.stdout.splitlines() == [str(REPO / "lit_amp" / "__init__.py"),
                                         str(tmp_path / "venv")]
    cli = subprocess.run([str(tmp_path / "venv" / "bin" / "lit-amp"), "--help"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert cli.returncode == 0 and "Configuration groups" in cli.stdout, cli.stderr[-2000:]


JUNIT = """<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="3" failures="1"
errors="0" skipped="1"><testcase classname="tests.cuda.test_a" name="test_ok"/>
<testcase classname="tests.cuda.test_a" name="test_bad"><failure message="x"/></testcase>
<testcase classname="tests.cuda.test_a" name="test_skip"><skipped/></testcase>
</testsuite></testsuites>"""


def _fake_results(out: Path) -> None:
    (out / "junit_cuda.xml").write_text(JUNIT)
    info = {"device": "NVIDIA H200", "driver": "580", "cuda": "13.0", "python": "3.12.3",
            "torch": "2.11.0", "lightning": "2.6.6", "torchmetrics": "1.9.0", "numpy": "2"}
    counts = check.junit_counts(out / "junit_cuda.xml")
    tests = {"cuda": {**counts, "rc": 1, "seconds": 3.0, "ok": False}}
    (out / "gpu_amp.md").write_text("NVIDIA H200\n\n| variant | steps/s |\n|---|---|\n| O2 | 9 |\n")
    (out / "gpu_amp.json").write_text(json.dumps({"device": "NVIDIA H200"}))
    benches = {"gpu_amp": {"rc": 0, "seconds": 1.0, "ok": True}}
    (out / "gpu_summary.md").write_text(check.summary(info, tests, benches, out))
    (out / "gpu_check.json").write_text(json.dumps({"ok": False}))
    check.pack(out)


def test_results_are_counted_packed_and_reported_into_the_docs(tmp_path):
    out, results = tmp_path / "out", tmp_path / "results"
    out.mkdir()
    _fake_results(out)
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_results.tgz",
                                                     "gpu_summary.md"]
    with tarfile.open(out / "gpu_results.tgz") as tar:
        assert "junit_cuda.xml" in tar.getnames()
    summary = (out / "gpu_summary.md").read_text()
    assert "| cuda | 1 | 1 | 0 | 1 | 3.0 | NO |" in summary  # a skip or a failure is not ok
    assert "cuda failed: tests.cuda.test_a::test_bad" in summary
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\nbefore\n\n{report.BEGIN}\nold\n{report.END}\n\nafter\n")
    for _ in range(2):  # a second report replaces the first
        report.report(out, results, doc)
        text = doc.read_text()
        assert text.count(report.BEGIN) == 1 and "old" not in text
        assert re.search(r"### gpu-check on NVIDIA H200 .*\n", text)
        assert text.startswith("# Benchmarks\n\nbefore") and text.rstrip().endswith("after")
    kept = json.loads((results / "gpu_amp.json").read_text())
    assert kept["device"] == "NVIDIA H200"
    assert kept["history"] == [{"device": "NVIDIA H200"}]  # the first report's run, kept
    assert (results / "gpu_check.json").is_file()


def test_report_says_what_it_needs_when_the_folder_is_not_a_gpu_check_output(tmp_path):
    with pytest.raises(SystemExit, match="neither gpu_results.tgz nor gpu_summary.md"):
        report.report(tmp_path, tmp_path / "r", tmp_path / "doc.md")


def test_a_run_stopped_before_its_junit_file_is_counted_from_its_log(tmp_path):
    log = tmp_path / "log_suite.txt"
    log.write_text("tests/a.py::test_x \n[gw1] [  3%] PASSED tests/a.py::test_x \n"
                   "[gw0] [  5%] FAILED tests/b.py::test_y[both, resumed] \n"
                   "[gw0] [  6%] ERROR tests/b.py::test_y[both, resumed] \n"
                   "[gw2] [ 83%] SKIPPED tests/c.py::test_z \ngpu-check: stopped after 9 s\n")
    counts = check._counts(tmp_path / "junit_suite.xml", log)
    assert counts == {"tests": 4, "failures": 1, "errors": 1, "skipped": 1, "incomplete": True,
                      "failed": ["tests/b.py::test_y[both, resumed]"] * 2}
    r = {**counts, "rc": 124, "seconds": 9.0, "ok": False}
    info = {"python": "3.12", "torch": "2.11", "lightning": "2.6.6", "torchmetrics": "1.9",
            "numpy": "2"}
    assert "| suite | 1 | 1 | 1 | 1 | 9.0 | NO (stopped before the end) |" in check.summary(
        info, {"suite": r}, None, tmp_path)
