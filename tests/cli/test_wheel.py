"""A wheel of lit_amp works: built offline, installed into a fresh folder, run from elsewhere;
and installed into an empty venv with only its declared dependencies, ``lit-amp`` runs its
default experiment (issue #28, item 1)."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LIT_AMP_LOG_DIR", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", **extra)
    return env


@pytest.mark.slow
def test_wheel_installs_and_runs_from_outside_the_repository(tmp_path, lit_amp_wheel):
    wheel, _ = lit_amp_wheel
    target, work = tmp_path / "target", tmp_path / "elsewhere"
    work.mkdir()
    inst = subprocess.run([*PIP, "install", "--no-deps", "--target", str(target), str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert inst.returncode == 0, inst.stderr[-2000:]
    assert (target / "lit_amp" / "cli" / "conf" / "config.yaml").is_file()
    env = _clean_env(PYTHONPATH=str(target))
    where = subprocess.run([sys.executable, "-c", "import lit_amp; print(lit_amp.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert where.stdout.strip().startswith(str(target)), where.stdout + where.stderr
    run = subprocess.run(
        [sys.executable, "-m", "lit_amp", "epochs=1", "data=synthetic", "data.num_train=200",
         "data.num_valid=100", "callbacks=minimal", "trainer.enable_progress_bar=false",
         "hydra.run.dir=out"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((work / "out" / "result.json").read_text())
    assert result["status"] == "ok" and 0.0 <= result["value"] <= 1.0
    assert "test accuracy:" in run.stdout


def _registry_unreachable(tmp: Path) -> str | None:
    """Why pip cannot fetch from the package registry, or None when it can (a few seconds).

    mnist1d, a declared dependency, is not on this machine's disk: fetching it (14 kB) needs
    the registry; a 5 s timeout without retries keeps the offline answer quick.
    """
    try:
        proc = subprocess.run([*PIP, "download", "--no-deps", "--no-cache-dir", "--timeout",
                               "5", "--retries", "0", "-d", str(tmp), "mnist1d"],
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "pip download mnist1d took over 60 s"
    if proc.returncode == 0:
        return None
    return (proc.stderr.strip().splitlines() or ["(no output)"])[-1]


@pytest.mark.slow
def test_the_wheel_in_an_empty_venv_runs_lit_amps_default_experiment(tmp_path, lit_amp_wheel):
    # a pip user's first command: `pip install lit_amp-*.whl` into a fresh venv, then
    # `lit-amp debug=limit` in an empty folder (the default experiment, 5 batches x 2 epochs)
    why = _registry_unreachable(tmp_path / "probe")
    if why is not None:
        pytest.skip(f"the package registry is unreachable, so the wheel's dependencies cannot "
                    f"be installed into an empty venv: {why}")
    torch_version = md.version("torch")
    if "+cpu" not in torch_version:  # a fresh venv would download a multi-GB CUDA build
        pytest.skip(f"this suite's torch {torch_version} is not a CPU build (+cpu) to reuse")
    wheel, _ = lit_amp_wheel
    venv, work = tmp_path / "venv", tmp_path / "empty"
    work.mkdir()
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                       timeout=120)
        vpy = venv / "bin" / "python"
        pins = tmp_path / "constraints.txt"  # the CPU torch on disk, never a CUDA download
        pins.write_text(f"torch=={torch_version}\n")
        # --no-compile: the .pyc of torch's ~3,000 modules are not written at install (the
        # run below compiles only those it imports); what is installed is the same
        inst = subprocess.run([*PIP, "--python", str(vpy), "install", "-q", "--no-compile",
                               "-c", str(pins), str(wheel)],
                              capture_output=True, text=True, timeout=600)
        assert inst.returncode == 0, inst.stdout[-2000:] + inst.stderr[-3000:]
        probe = ("import importlib.util as u; print(u.find_spec('lit_amp').origin); "
                 "print([m for m in ('pytest', 'ruff', 'mkdocs') if u.find_spec(m)])")
        where = subprocess.run([str(vpy), "-c", probe], cwd=work, env=_clean_env(),
                               capture_output=True, text=True, timeout=120)
        assert where.stdout.splitlines() == [
            str(venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
                / "site-packages" / "lit_amp" / "__init__.py"), "[]"], where.stderr
        run = subprocess.run([str(venv / "bin" / "lit-amp"), "debug=limit"], cwd=work,
                             env=_clean_env(), capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        assert "test accuracy:" in run.stdout
        (result,) = work.glob("runs/debug/*/result.json")
        assert json.loads(result.read_text())["status"] == "ok"
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # ~1.5 GB: not left to pytest's tmp retention
