"""``make gpu-check PART=tests|bench|all``: prove lit_amp's CUDA side on a GPU machine, offline.

Run from the repository root on the GPU machine, with ``.whl/`` (``make gpu-wheels``) carried
along. Standard library only, because it runs before anything is installed:

1. refuses (exit 2, saying what to do) when the Python given (``GPU_PY``, default the one
   running this) has no torch or sees no CUDA device;
2. makes a throwaway environment over the image's own packages: a venv whose ``.pth`` adds
   the image's site-packages, the carried wheels installed into it with ``--no-deps``,
   lit_amp from this checkout, and its ``lit-amp`` command;
3. ``tests``: the CUDA subset (``pytest -m cuda tests/cuda``, with the GPU; a skip there is a
   failure) and the whole suite as ``make test`` runs it (GPU hidden: the suite's assertions
   are the CPU's; the CUDA subset's logic on the CPU), on all cores (``cuda`` / ``suite``:
   one of the two); ``bench``: the three GPU benchmarks (``bench/gpu_*.py``);
4. writes everything (JUnit XML, logs, JSON, markdown) under ``--out`` (``$GPU_OUT``,
   ``$OUT`` or ``gpu-out/``), packs it into ``gpu_results.tgz`` beside ``gpu_summary.md``
   (``make gpu-report GPU_OUT=...`` turns them into bench/results/ and docs/benchmarks.md),
   and prints the summary last.

Exit status: 0 when every part ran and passed, 1 when something failed, 2 when refused.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: PART: ``tests`` is ``cuda`` + ``suite``; ``all`` is everything; several join with commas.
PARTS = {"cuda": {"cuda"}, "suite": {"suite"}, "tests": {"cuda", "suite"},
         "bench": {"bench"}, "all": {"cuda", "suite", "bench"}}
#: The GPU benchmarks and each one's time budget in seconds (issue #24: a part <= 9 min).
BENCHES = {"gpu_amp": 90, "gpu_host_bound": 40, "gpu_loss_scale": 30}
#: Wall-clock limits of the two test runs (s; ``GPU_SUITE_TIMEOUT`` overrides the second).
CUDA_TESTS_TIMEOUT = 240
SUITE_TIMEOUT = int(os.environ.get("GPU_SUITE_TIMEOUT", 420))

_PROBE = r"""
import json, os, platform, site, sys
info = {"python": platform.python_version(), "executable": sys.executable,
        "cores": os.cpu_count(),
        "site": [p for p in site.getsitepackages() if p.endswith("-packages")]}
try:
    import torch
except Exception as e:
    info["error"] = f"cannot import torch: {e!r}"
else:
    info.update(torch=torch.__version__, cuda=torch.version.cuda,
                cuda_available=torch.cuda.is_available(), devices=torch.cuda.device_count())
    if info["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        info.update(device=p.name, capability=f"{p.major}.{p.minor}",
                    memory_gib=round(p.total_memory / 2**30, 1),
                    multiprocessors=p.multi_processor_count,
                    bf16=torch.cuda.is_bf16_supported())
    for mod in ("lightning", "torchmetrics", "numpy", "pytest"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:
            info[mod] = None
    import importlib.util
    info["plugins"] = [m for m in ("xdist", "pytest_timeout")
                       if importlib.util.find_spec(m) is not None]
print(json.dumps(info))
"""


class Refused(SystemExit):
    """gpu-check cannot run here; the message says what to do instead (exit status 2)."""

    def __init__(self, message: str) -> None:
        print(f"gpu-check: {message}", file=sys.stderr)
        super().__init__(2)


def probe(python: str) -> dict:
    """What ``python`` sees: versions, CUDA device, driver (``nvidia-smi``)."""
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True,
                             timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Refused(f"cannot run GPU_PY={python!r}: {e}") from e
    if out.returncode != 0:
        raise Refused(f"GPU_PY={python!r} failed: {out.stderr.strip()[-500:]}")
    info = json.loads(out.stdout.strip().splitlines()[-1])
    smi = shutil.which("nvidia-smi")
    if smi:
        q = subprocess.run([smi, "--query-gpu=name,driver_version",
                            "--format=csv,noheader"], capture_output=True, text=True)
        if q.returncode == 0 and q.stdout.strip():
            info["driver"] = q.stdout.strip().splitlines()[0].split(",")[-1].strip()
    return info


def check_cuda(info: dict, python: str) -> None:
    """Refuse, saying what to do, unless ``python`` has torch and sees a CUDA device."""
    if "error" in info:
        raise Refused(f"GPU_PY={python!r} {info['error']}. Run it on the GPU machine, with "
                      "GPU_PY naming the Python that holds its CUDA build of torch.")
    if not info.get("cuda_available"):
        raise Refused(
            f"no CUDA device is visible (GPU_PY={python!r}: torch {info['torch']}, "
            f"CUDA {info['cuda']}, torch.cuda.is_available() is False). make gpu-check runs "
            "on a machine with an NVIDIA GPU; on this machine run `make test` (the CPU "
            "suite) and `make gpu-wheels` (the wheels the GPU machine needs).")


def make_env(python: str, info: dict, venv: Path, wheels: Path) -> Path:
    """A venv over the image's packages + the carried wheels + this checkout; its python."""
    subprocess.run([python, "-m", "venv", "--without-pip", "--clear", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    site_dir = Path(subprocess.run(
        [str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    site_dir.mkdir(parents=True, exist_ok=True)
    # the image's own site-packages (its torch), processed with their .pth files
    (site_dir / "_gpu_image.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in info["site"]))
    whls = sorted(wheels.glob("*.whl"))
    if whls:
        subprocess.run([python, "-m", "pip", "--disable-pip-version-check", "install", "-q",
                        "--no-index", "--no-deps", "--no-compile", "--upgrade", "--target",
                        str(site_dir), *map(str, whls)], check=True)
    (site_dir / "_lit_amp_checkout.pth").write_text(f"{REPO}\n")  # as `pip install -e .`
    script = venv / "bin" / "lit-amp"
    script.write_text(f"#!{vpy}\nimport sys\nfrom lit_amp.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    missing = subprocess.run(
        [str(vpy), "-c", "import importlib.util as u; print(' '.join(m for m in ('hydra', "
         "'omegaconf', 'mnist1d', 'lit_amp', 'torch', 'lightning') if u.find_spec(m) is None))"],
        capture_output=True, text=True, check=True).stdout.strip()
    if missing:
        raise Refused(f"the environment lacks {missing}: run `make gpu-wheels` where the "
                      "package registry is reachable and carry .whl/ to this machine.")
    return vpy


def junit_counts(path: Path) -> dict:
    """tests / failures / errors / skipped of a JUnit XML file (zeros if absent)."""
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if not path.is_file():
        return counts
    root = ET.parse(path).getroot()
    for suite in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
        for k in counts:
            counts[k] += int(suite.get(k, 0))
    counts["failed"] = [
        f"{c.get('classname')}::{c.get('name')}" for c in root.iter("testcase")
        if c.find("failure") is not None or c.find("error") is not None]
    return counts


def log_counts(log: Path) -> dict:
    """The same counts read from a ``-v`` log, for a run stopped before its JUnit file."""
    import re

    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "failed": [],
              "incomplete": True}
    key = {"PASSED": None, "FAILED": "failures", "ERROR": "errors", "SKIPPED": "skipped"}
    seen = set()
    for line in log.read_text(errors="replace").splitlines() if log.is_file() else []:
        m = re.match(r"^(?:\[gw\d+\] )?\[\s*\d+%\] (PASSED|FAILED|ERROR|SKIPPED) (.+?)\s*$", line)
        if m and (m[1], m[2]) not in seen:
            seen.add((m[1], m[2]))
            counts["tests"] += 1  # as in JUnit files, an error counts as a test
            if key[m[1]]:
                counts[key[m[1]]] += 1
            if m[1] in ("FAILED", "ERROR"):
                counts["failed"].append(m[2])
    return counts


def run_logged(cmd: list[str], log: Path, timeout: int, env: dict | None = None) -> dict:
    """Run ``cmd`` in the repository, its output into ``log``; rc (124: timed out), seconds."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        try:
            rc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
            f.write(f"\ngpu-check: stopped after {timeout} s\n")
    return {"rc": rc, "seconds": round(time.perf_counter() - t0, 1)}


def pytest_cmd(vpy: Path, info: dict, workers: int, limit: int) -> list[str]:
    """pytest on ``workers`` processes, one line per test, ending itself (its report and
    JUnit file written) before ``limit`` seconds where pytest-timeout is there."""
    cmd = [str(vpy), "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rfEs"]
    if "xdist" in info.get("plugins", ()) and workers > 1:
        # tests sharing a module-, package- or session-scoped fixture (a SLURM cluster, a
        # wheel build) on one worker: the groups of tests/conftest.py
        cmd += ["-n", str(workers), "--dist", "loadgroup"]
    if "pytest_timeout" in info.get("plugins", ()):
        # one hung test must not take the whole run with it
        cmd += ["--timeout", str(min(300, limit // 2)), "--session-timeout", str(limit - 20)]
    return cmd


def _counts(junit: Path, log: Path) -> dict:
    return junit_counts(junit) if junit.is_file() else log_counts(log)


def run_tests(vpy: Path, info: dict, out: Path, parts: set[str]) -> dict:
    """The CUDA subset (GPU visible; skips fail it) and the whole suite (GPU hidden)."""
    cores = os.cpu_count() or 1
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("LIT_AMP_CUDA_TESTS_ON", None)
    runs = {}
    if "cuda" in parts:
        cuda = run_logged([*pytest_cmd(vpy, info, min(4, cores), CUDA_TESTS_TIMEOUT), "-m",
                           "cuda", "tests/cuda",
                           f"--junitxml={out / 'junit_cuda.xml'}"],
                          out / "log_cuda.txt", CUDA_TESTS_TIMEOUT, env)
        cuda.update(_counts(out / "junit_cuda.xml", out / "log_cuda.txt"))
        cuda["ok"] = (cuda["rc"] == 0 and cuda["tests"] > 0 and cuda["skipped"] == 0)
        runs["cuda"] = cuda
    if "suite" in parts:
        hidden = {**env, "CUDA_VISIBLE_DEVICES": "", "LIT_AMP_CUDA_TESTS_ON": "cpu",  # make test
                  "OMP_NUM_THREADS": "1"}  # one thread per worker: no 16 x 16 oversubscription
        suite = run_logged([*pytest_cmd(vpy, info, cores, SUITE_TIMEOUT),
                            f"--junitxml={out / 'junit_suite.xml'}"],
                           out / "log_suite.txt", SUITE_TIMEOUT, hidden)
        suite.update(_counts(out / "junit_suite.xml", out / "log_suite.txt"))
        suite["ok"] = suite["rc"] == 0 and suite["tests"] > 0
        runs["suite"] = suite
    return runs


def run_benches(vpy: Path, out: Path) -> dict:
    """Each GPU benchmark in its own process, within its budget; results land in ``out``."""
    results = {}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for name, budget in BENCHES.items():
        r = run_logged([str(vpy), f"bench/{name}.py", "--budget-s", str(budget), "--out",
                        str(out)], out / f"log_{name}.txt", budget * 2 + 60, env)
        r["ok"] = r["rc"] == 0 and (out / f"{name}.json").is_file()
        results[name] = r
    return results


def summary(info: dict, tests: dict | None, benches: dict | None, out: Path) -> str:
    """The markdown summary printed last (and kept beside the packed results)."""
    lines = [f"# gpu-check on {info.get('device')} (driver {info.get('driver')}, "
             f"CUDA {info.get('cuda')})", "",
             f"python {info['python']}, torch {info['torch']}, lightning {info['lightning']}, "
             f"torchmetrics {info['torchmetrics']}, numpy {info['numpy']}, "
             f"{info.get('cores')} cores", ""]
    if tests:
        lines += ["| run | passed | failed | errors | skipped | seconds | ok |",
                  "|---|---|---|---|---|---|---|"]
        for name, r in tests.items():
            passed = r["tests"] - r["failures"] - r["errors"] - r["skipped"]
            ok = "yes" if r["ok"] else "NO" + (" (stopped before the end)" if r["rc"] == 124
                                                 or r.get("incomplete") else "")
            lines.append(f"| {name} | {passed} | {r['failures']} | {r['errors']} | "
                         f"{r['skipped']} | {r['seconds']} | {ok} |")
        for name, r in tests.items():
            lines += [f"- {name} failed: {t}" for t in r.get("failed", [])]
        lines.append("")
    if benches:
        for name, r in benches.items():
            md = out / f"{name}.md"
            lines += ([md.read_text().strip(), ""] if md.is_file()
                      else [f"- {name}: FAILED (rc {r['rc']}, log_{name}.txt)", ""])
    return "\n".join(lines) + "\n"


def pack(out: Path) -> Path:
    """Everything under ``out`` into ``out/gpu_results.tgz`` (a device call returns <= 8 files)."""
    tgz = out / "gpu_results.tgz"
    files = [p for p in sorted(out.iterdir()) if p.is_file() and p.name != tgz.name]
    with tarfile.open(tgz, "w:gz") as tar:
        for p in files:
            tar.add(p, arcname=p.name)
    for p in files:
        if p.name not in ("gpu_summary.md", "gpu_check.json"):
            p.unlink()
    return tgz


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="all",
                        help="tests | bench | all, or cuda / suite alone; several: cuda,bench")
    parser.add_argument("--python", default=os.environ.get("GPU_PY") or sys.executable,
                        help="the Python that holds the CUDA build of torch (GPU_PY)")
    parser.add_argument("--out", type=Path,
                        default=Path(os.environ.get("GPU_OUT") or os.environ.get("OUT")
                                     or REPO / "gpu-out"))
    parser.add_argument("--wheels", type=Path, default=REPO / ".whl")
    parser.add_argument("--venv", type=Path, default=Path("/tmp/lit_amp-gpu-venv"))
    args = parser.parse_args(argv)

    unknown = set(args.part.split(",")) - set(PARTS)
    if unknown:
        raise Refused(f"PART={args.part!r}: {sorted(unknown)} unknown; allowed: "
                      f"{', '.join(PARTS)} (several joined by commas)")
    parts = set().union(*(PARTS[p] for p in args.part.split(",")))
    info = probe(args.python)
    check_cuda(info, args.python)
    args.out.mkdir(parents=True, exist_ok=True)
    vpy = make_env(args.python, info, args.venv, args.wheels)
    info = {**probe(str(vpy)), "driver": info.get("driver"), "part": args.part}
    print(json.dumps(info), flush=True)
    (args.out / "gpu_env.json").write_text(json.dumps(info, indent=1) + "\n")
    tests = run_tests(vpy, info, args.out, parts) if parts & {"cuda", "suite"} else None
    benches = run_benches(vpy, args.out) if "bench" in parts else None
    text = summary(info, tests, benches, args.out)
    (args.out / "gpu_summary.md").write_text(text)
    ok = all(r["ok"] for r in [*(tests or {}).values(), *(benches or {}).values()])
    (args.out / "gpu_check.json").write_text(json.dumps(
        {"env": info, "tests": tests, "benches": benches, "ok": ok}, indent=1) + "\n")
    pack(args.out)
    print(text, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
