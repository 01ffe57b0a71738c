"""``make gpu-wheels``: the wheels the GPU machine's image lacks, downloaded into ``.whl/``.

The GPU machine (Python 3.12, torch 2.11 + CUDA 13, lightning 2.6.6, no network) holds most of
what lit_amp needs; ``WHEELS`` is the rest, pinned, and ``IMAGE_HAS`` what the image already
has (tests/test_gpu_kit.py checks that lit_amp's requirements, followed through their own,
are covered by the two). antlr4-python3-runtime 4.9.3 exists on PyPI only as a source archive:
it is pure Python, so it is built here into a ``py3-none-any`` wheel.

Usage: ``python3 gpu/wheels.py [--dest .whl]`` (needs the package registry).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

#: What the GPU image already holds that lit_amp, its tests and benchmarks use (normalized
#: name -> version read off the image on 2026-11-26, None where not read). pyproject's lower
#: bounds of torch, lightning and torchmetrics are the older of these and the CPU machine's
#: (torch 2.13.0): the versions the suite has passed on.
IMAGE_HAS: dict[str, str | None] = {
    "torch": "2.11.0", "lightning": "2.6.6", "pytorch-lightning": "2.6.6",
    "torchmetrics": "1.9.0", "numpy": "2.5.2", "pytest": "9.1.1", "pytest-xdist": "3.8.0",
    "pytest-timeout": "2.5.0", "hypothesis": "6.168.3",
    **dict.fromkeys(("lightning-utilities", "pyyaml", "packaging", "typing-extensions",
                     "fsspec", "tqdm", "filelock", "jinja2", "networkx", "sympy",
                     "setuptools", "matplotlib", "scipy", "requests", "tensorboard",
                     "aiohttp", "pillow")),
}

#: Requirements of lit_amp's test set-up that the GPU machine does not need.
NOT_NEEDED = {"ruff": "lint runs on the CPU machine",
              "hydra-submitit-launcher": "the slurm tests skip where SLURM is not installed",
              "submitit": "the slurm tests skip where SLURM is not installed",
              "hydra-optuna-sweeper": "tests/cli/test_optuna_search.py skips without it "
                                      "(optuna pulls ~20 wheels; the search runs on the CPU)"}

#: Downloaded by ``make gpu-wheels`` (name -> version): hydra and its parser for the CLI,
#: mnist1d for the demo data, pytest-rerunfailures for ``make test``'s rerun option.
WHEELS = {
    "hydra-core": "1.3.8",
    "omegaconf": "2.3.1",
    "antlr4-python3-runtime": "4.9.3",
    "mnist1d": "0.0.2.post1",
    "pytest-rerunfailures": "16.7",
}

#: Published only as a source archive (pure Python): built into a wheel here.
SDIST_ONLY = frozenset({"antlr4-python3-runtime"})

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
MAX_BYTES = 64 * 2**20  # what one device call carries


def download(dest: Path) -> list[Path]:
    """Download (or build) every wheel of ``WHEELS`` into ``dest``; returns their paths."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    binary = [f"{n}=={v}" for n, v in WHEELS.items() if n not in SDIST_ONLY]
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--implementation", "cp", *plat, "-d", str(dest), *binary],
                   check=True)
    for name in sorted(SDIST_ONLY):
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([*pip, "download", "--no-deps", "--no-binary=:all:", "-d", tmp,
                            f"{name}=={WHEELS[name]}"], check=True)
            sdist = next(Path(tmp).iterdir())
            subprocess.run([*pip, "wheel", "--no-deps", "-w", str(dest), str(sdist)],
                           check=True)
    wheels = sorted(dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    if len(wheels) != len(WHEELS) or size > MAX_BYTES:
        raise SystemExit(f"gpu-wheels: expected {len(WHEELS)} wheels under 64 MiB, got "
                         f"{len(wheels)} ({size / 2**20:.1f} MiB) in {dest}")
    return wheels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path(".whl"))
    args = parser.parse_args(argv)
    wheels = download(args.dest)
    total = sum(w.stat().st_size for w in wheels) / 2**20
    for w in wheels:
        print(f"  {w.name}")
    print(f"gpu-wheels: {len(wheels)} wheels, {total:.1f} MiB in {args.dest}/ "
          "(carry it to the GPU machine with the repository)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
