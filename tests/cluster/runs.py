"""What the cluster tests run on the test cluster, each started by name (:data:`STARTERS`).

- ``amp_sweep``: ``lit-amp -m hydra/launcher=slurm trainer=ddp trainer.devices=2 amp=O0,O2``,
  and ``amp_local``: the same sweep launched here by Lightning (no SLURM);
- ``faults``: three jobs of the same training with ``callbacks=fault_tolerant``: job 0 gets
  ``scontrol requeue`` and job 1 ``scancel --signal=USR2`` (submitit's signal) after 2 steps
  of their first start, job 2 is left alone (the uninterrupted reference);
- ``time_limit``: the same training with a 2-minute time limit that its first start cannot
  meet (each step sleeps 15 s: 12 steps, 180 s) and no early warning signal
  (``signal_delay_s=0``);
- ``lost_job``: three jobs of the same training again: job 0's training processes (both
  ranks) are SIGKILLed after 2 steps (as the OOM killer or a lost node would: the SLURM job
  ends without a result), job 1 gets ``scancel --signal=USR2 --batch`` (the batch shell
  only) after 2 steps, job 2 is left alone (the reference);
- ``optuna_slurm``: ``lit-amp hparams_search=optuna hydra/launcher=slurm``, 2 trials at once;
- ``sbatch_example``: ``sbatch --wait examples/slurm_train.sbatch`` (``srun python
  examples/slurm_train.py`` on 2 tasks);
- ``bad_inputs``: four commands SLURM cannot run, each expected to fail with one message.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster.campaign import (
    DDP,
    LIT_AMP,
    REPO,
    TRAIN,
    Part,
    client_env,
    slurm,
    wait_for_training,
    watch_probe,
)
from tests.cluster.slurm_cluster import SlurmCluster

#: the names of the runs the collected tests ask for (set at collection)
WANTED = pytest.StashKey[list]()
#: seconds each step of a faulted job's first start sleeps (time to signal it mid-training)
FAULT_STEP_S = 0.8


class Campaign:
    """The runs of one test session on one cluster, each started once."""

    def __init__(self, cluster: SlurmCluster, root: Path) -> None:
        self.cluster, self.root = cluster, root
        self.env = client_env(cluster.env)
        self.parts: dict[str, object] = {}

    def start(self, name: str) -> object:
        """Start the run ``name`` unless it runs already; its part(s)."""
        if name not in self.parts:
            self.parts[name] = STARTERS[name](self)
        return self.parts[name]

    def _each(self) -> list[Part]:
        out: list[Part] = []
        for part in self.parts.values():
            out += list(part.values()) if isinstance(part, dict) else [part]
        return out

    def stop(self) -> None:
        """Kill what still runs (a test that failed early leaves its run behind)."""
        for part in self._each():
            if part.proc.poll() is None:
                part.proc.kill()
                part.proc.wait()

    def timings(self) -> str:
        return ", ".join(f"{p.name} {p.wall_s:.1f} s" for p in self._each()
                         if p.wall_s is not None)

    def lit_amp(self, name: str, *args: str) -> Part:
        """``lit-amp`` with ``args`` and this part's sweep directory (``<part>/sweep``)."""
        sweep = self.root / name / "sweep"
        return Part(name, [*LIT_AMP, *args, f"hydra.sweep.dir={sweep}"], self.root, self.env,
                    cwd=REPO)


def _amp_sweep(c: Campaign) -> Part:
    return c.lit_amp("amp_sweep", "-m", "hydra/launcher=slurm", *DDP, *TRAIN,
                     "callbacks=minimal", "amp=O0,O2")


def _amp_local(c: Campaign) -> Part:
    return c.lit_amp("amp_local", "-m", *DDP, *TRAIN, "callbacks=minimal", "amp=O0,O2")


def _faults(c: Campaign) -> Part:
    part = c.lit_amp("faults", "-m", "hydra/launcher=slurm", *DDP, *TRAIN,
                     "callbacks=fault_tolerant", f"+callbacks.probe.sleep_s={FAULT_STEP_S}",
                     "tags=[requeue],[signal],[reference]")
    sweep = part.dir / "sweep"
    watch_probe(part, sweep / "0", 2, lambda job: slurm(c.env, "scontrol", "requeue", job),
                "requeue")
    watch_probe(part, sweep / "1", 2,
                lambda job: slurm(c.env, "scancel", "--signal=USR2", job), "usr2")
    return part


def _kill_ranks(job_dir: Path) -> None:
    """SIGKILL every rank's training process of the job (their pids from the probe)."""
    from tests.cluster import probe

    deadline = time.monotonic() + 30
    while True:
        pids = {r["pid"] for rank in probe.read(job_dir / "probe").values() for r in rank
                if r["kind"] == "start" and r["start"] == 0}
        if len(pids) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if len(pids) != 2:
        raise RuntimeError(f"found the pids of {len(pids)} of the 2 ranks in {job_dir}")
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def _lost_job(c: Campaign) -> Part:
    part = c.lit_amp("lost_job", "-m", "hydra/launcher=slurm", *DDP, *TRAIN,
                     "callbacks=fault_tolerant", f"+callbacks.probe.sleep_s={FAULT_STEP_S}",
                     "tags=[killed],[batch_signal],[reference]")
    sweep = part.dir / "sweep"
    watch_probe(part, sweep / "0", 2, lambda job: _kill_ranks(sweep / "0"), "sigkill")
    watch_probe(part, sweep / "1", 2,
                lambda job: slurm(c.env, "scancel", "--signal=USR2", "--batch", job),
                "usr2_batch")
    return part


def _time_limit(c: Campaign) -> Part:
    part = c.lit_amp("time_limit", "-m", "hydra/launcher=slurm", *DDP, *TRAIN,
                     "callbacks=fault_tolerant", "+callbacks.probe.sleep_s=15",
                     "hydra.launcher.timeout_min=2", "hydra.launcher.signal_delay_s=0",
                     "tags=[time_limit]")
    # its first start must be training when the 2-minute limit kills it: the other runs start
    # only once it is (on a slow 2-core machine their start-ups, alongside its own, once kept
    # it importing for a whole minute); its 12 steps of 15 s outlast the limit however late
    # slurmctld enforces it (it once let a 74 s start of 6 s steps finish against 1 minute).
    # Every start has the same limit: the requeued one must start up and finish within it (with
    # 1 minute, a loaded CI machine's requeued start-up was killed before submitit installed
    # its handler, so the job ended TIMEOUT without a requeue)
    wait_for_training(part, part.dir / "sweep" / "0")
    return part


def _optuna_slurm(c: Campaign) -> Part:
    return c.lit_amp("optuna_slurm", "hparams_search=optuna", "hydra/launcher=slurm",
                     "trainer=cpu", "data=synthetic", "model=mlp", "data.num_train=96",
                     "data.num_valid=32", "epochs=1", "logger=none",
                     "trainer.enable_progress_bar=false", "hydra.sweeper.n_trials=2",
                     "hydra.sweeper.n_jobs=2")


def _sbatch_example(c: Campaign) -> Part:
    out = c.root / "sbatch_example"
    return Part("sbatch_example", ["sbatch", "--wait", f"--output={out}/slurm-%j.out",
                                   f"--export=ALL,SLURM_TRAIN_OUT={out / 'run'},"
                                   f"PYTHON={sys.executable}",
                                   str(REPO / "examples" / "slurm_train.sbatch")],
                c.root, c.env, cwd=REPO)


#: bad input -> the extra arguments of ``lit-amp -m hydra/launcher=slurm trainer=ddp ...``
BAD = {
    "devices_over_cpus": ["trainer.devices=3"],
    "no_such_partition": ["trainer.devices=2", "hydra.launcher.partition=nope"],
    "devices_auto": ["trainer.devices=auto"],
    "stays_pending": ["trainer.devices=2", "hydra.launcher.partition=down",
                      "hydra.launcher.max_pending_min=0.1"],
}


def _bad_inputs(c: Campaign) -> dict[str, Part]:
    return {name: c.lit_amp(name, "-m", "hydra/launcher=slurm", "trainer=ddp",
                            "trainer.accelerator=cpu", *extra, *TRAIN[:6], "amp=O0")
            for name, extra in BAD.items()}


#: in the order they start: the longest first (the time limit alone takes over a minute)
STARTERS: dict[str, Callable[[Campaign], object]] = {
    "time_limit": _time_limit, "faults": _faults, "lost_job": _lost_job, "amp_sweep": _amp_sweep,
    "sbatch_example": _sbatch_example, "optuna_slurm": _optuna_slurm, "amp_local": _amp_local,
    "bad_inputs": _bad_inputs,
}


def wait_all(parts: list[Part], timeout_s: float) -> None:
    """Wait for every part (each killed after ``timeout_s`` from its start)."""
    deadline = time.monotonic() + timeout_s
    for part in parts:
        part.wait(max(1.0, deadline - time.monotonic()))
