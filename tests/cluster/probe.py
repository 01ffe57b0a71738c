"""A Lightning callback the cluster tests add to a ``lit-amp`` run: what each rank trained.

``+callbacks.probe._target_=tests.cluster.probe.Probe`` (with
``extra_trusted_targets=[tests.cluster.probe.*]``) writes ``<dir>/rank<r>.jsonl`` (``<dir>``:
the run directory's ``probe/`` unless ``directory`` is given): a
``start`` record per start of the job (its SLURM job id, the rank's process id, how many
times SLURM started it before, the world size, Lightning's cluster environment and its
auto-requeue, the SIGUSR1 handler during training), then one ``step`` record per trained
batch with a short hash of each sample, and at train end rank 0 saves the network's
parameters to
``<dir>/params-start<n>.pt``. ``sleep_s`` slows each step of the job's first start only, so
that a test can signal a job in the middle of its training.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch


def sample_ids(x: torch.Tensor) -> list[str]:
    """A short hash of each row of a batch's inputs."""
    return [hashlib.sha1(row.numpy().tobytes()).hexdigest()[:12] for row in x.detach().cpu()]


def read(directory: str | Path) -> dict[int, list[dict]]:
    """``{rank: records}`` of a probe directory."""
    out = {}
    for path in sorted(Path(directory).glob("rank*.jsonl")):
        rank = int(path.stem[4:])
        out[rank] = [json.loads(line) for line in path.read_text().splitlines() if line]
    return out


class Probe(L.Callback):
    """Record each rank's trained samples (see the module docstring).

    Args:
        directory: where the records go (None: ``probe/`` in the Hydra run directory).
        sleep_s: seconds each step of the job's first start sleeps.
    """

    def __init__(self, directory: str | None = None, sleep_s: float = 0.0) -> None:
        if directory is None:
            from hydra.core.hydra_config import HydraConfig

            directory = str(Path(HydraConfig.get().runtime.output_dir) / "probe")
        self.directory = Path(directory)
        self.sleep_s = float(sleep_s)
        self.start = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)

    def _write(self, trainer: L.Trainer, record: dict) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        record = {**record, "start": self.start, "t": time.time()}
        with open(self.directory / f"rank{trainer.global_rank}.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        env = trainer._accelerator_connector.cluster_environment
        usr1 = signal.getsignal(signal.SIGUSR1)
        array = os.environ.get("SLURM_ARRAY_JOB_ID")
        job = (f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID')}" if array
               else os.environ.get("SLURM_JOB_ID"))
        self._write(trainer, {"kind": "start", "job": job, "pid": os.getpid(),
                              "world": trainer.world_size,
                              "cluster_env": type(env).__name__,
                              "auto_requeue": getattr(env, "auto_requeue", None),
                              "sigusr1": getattr(usr1, "__name__", str(usr1))})

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.start == 0 and self.sleep_s:
            time.sleep(self.sleep_s)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        epoch = trainer.current_epoch + int(getattr(pl_module, "epoch_offset", 0) or 0)
        self._write(trainer, {"kind": "step", "epoch": epoch, "ids": sample_ids(batch[0])})

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_rank == 0:
            params = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
            torch.save(params, self.directory / f"params-start{self.start}.pt")
