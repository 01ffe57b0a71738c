"""The runs of the cluster tests, started together so that they share the wall time.

Each part is a ``lit-amp`` command (or ``sbatch``) started as a subprocess on the test
cluster; a part that needs a hand in the middle (``scontrol requeue``, a signal) gets a
watcher thread that acts when the job's :mod:`tests.cluster.probe` records show enough
trained steps. Tests wait for their part and read what it left on disk: every job's
``result.json``, the sweep summary, the probe records, SLURM's and submitit's logs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.cluster import probe

REPO = Path(__file__).resolve().parents[2]
LIT_AMP = [sys.executable, "-m", "lit_amp"]

#: the training every part runs: MLP on 96 synthetic samples, 2 epochs, batches of 8; under
#: 2-process DDP each rank trains 6 steps per epoch
TRAIN = ["data=synthetic", "model=mlp", "data.num_train=96", "data.num_valid=32",
         "data.batch_size=8", "epochs=2", "logger=none", "trainer.enable_progress_bar=false",
         "extra_trusted_targets=[tests.cluster.probe.*]",
         "+callbacks.probe._target_=tests.cluster.probe.Probe"]
DDP = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]


class Part:
    """One started command: its process, output file and folder.

    Args:
        name: the part's name (its folder under the campaign root).
        argv: the command.
        root: the campaign's folder.
        env: the environment.
        cwd: where it runs.
    """

    def __init__(self, name: str, argv: list[str], root: Path, env: dict,
                 cwd: Path | None = None) -> None:
        self.name, self.argv = name, argv
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.out = self.dir / "output.txt"
        self.t0 = time.monotonic()
        self.events: dict[str, float] = {}  # seconds after the start
        self.stamps: dict[str, float] = {}  # time.time()
        self.errors: list[str] = []
        with open(self.out, "wb") as f:
            self.proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env,
                                         cwd=cwd or self.dir)
        #: seconds from the start to the process's end (None while it runs)
        self.wall_s: float | None = None
        threading.Thread(target=self._time, daemon=True).start()

    def _time(self) -> None:
        self.proc.wait()
        self.wall_s = time.monotonic() - self.t0

    def wait(self, timeout_s: float) -> tuple[int, str]:
        """The exit status and output (the process is killed after ``timeout_s``)."""
        try:
            rc = self.proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - self.t0)))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            self.errors.append(f"{self.name}: killed after {timeout_s:.0f} s")
        return rc, self.out.read_text(errors="replace")

    def at(self, name: str) -> None:
        """Record the time of an event (seconds since the part started)."""
        self.events[name] = time.monotonic() - self.t0
        self.stamps[name] = time.time()


def sweep_args(sweep_dir: Path) -> list[str]:
    return [f"hydra.sweep.dir={sweep_dir}"]


def results(sweep_dir: Path) -> dict[int, dict]:
    """``{job number: result.json}`` of a sweep."""
    out = {}
    for path in sorted(Path(sweep_dir).glob("*/result.json")):
        out[int(path.parent.name)] = json.loads(path.read_text())
    return out


def steps(records: list[dict], start: int | None = None) -> list[dict]:
    """The step records of one start of the job (all starts: None)."""
    return [r for r in records if r["kind"] == "step" and (start is None or r["start"] == start)]


def wait_for_training(part: Part, job_dir: Path, timeout_s: float = 150.0) -> None:
    """Return once rank 0 of the job in ``job_dir`` has begun training its first start (its
    ``start`` record), the part has ended, or ``timeout_s`` passed (a test then reports it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and part.proc.poll() is None:
        if any(r["kind"] == "start" and r["start"] == 0
               for r in probe.read(job_dir / "probe").get(0, [])):
            part.at("training")
            return
        time.sleep(0.2)


def watch_probe(part: Part, job_dir: Path, min_steps: int, act: Callable[[str], None],
                label: str, timeout_s: float = 240.0) -> threading.Thread:
    """Call ``act(job id)`` once rank 0 of the job in ``job_dir`` has trained ``min_steps`` steps
    of its first start (from a thread; the time goes into ``part.events[label]``)."""

    def run() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and part.proc.poll() is None:
            records = probe.read(job_dir / "probe").get(0, [])
            starts = [r for r in records if r["kind"] == "start" and r["start"] == 0]
            if starts and len(steps(records, 0)) >= min_steps:
                part.at(label)
                try:
                    act(starts[0]["job"])
                except Exception as exc:  # noqa: BLE001 - reported by the test
                    part.errors.append(f"{label}: {exc!r}")
                return
            time.sleep(0.1)
        part.errors.append(f"{label}: the job never trained {min_steps} steps")

    thread = threading.Thread(target=run, name=f"{part.name}-{label}", daemon=True)
    thread.start()
    return thread


def slurm(env: dict, *argv: str) -> str:
    """Run a SLURM client command; its output (raises on failure)."""
    out = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {out.stderr.strip()}")
    return out.stdout


def params(job_dir: Path) -> dict[str, Any]:
    """The parameters rank 0 saved at the end of the job's last start."""
    import torch

    files = sorted((job_dir / "probe").glob("params-start*.pt"))
    assert files, f"no parameters saved in {job_dir / 'probe'}"
    return torch.load(files[-1], weights_only=True)


def client_env(cluster_env: dict) -> dict:
    """A client's environment: the cluster's, with this repository importable (the probe)."""
    path = os.pathsep.join(p for p in (str(REPO), cluster_env.get("PYTHONPATH", "")) if p)
    env = {k: v for k, v in cluster_env.items()
           if not k.startswith(("SLURM_JOB", "SLURM_ARRAY", "SLURM_STEP", "LOCAL_RANK",
                                "MASTER_", "RANK", "WORLD_SIZE"))}
    return {**env, "PYTHONPATH": path}
