"""``Model.fit`` as a SLURM job: ``sbatch examples/slurm_train.sbatch`` runs this on 2 tasks.

Every SLURM task runs this script (``srun python examples/slurm_train.py``); Lightning reads
SLURM's variables and joins the tasks into one DDP job (gloo on CPUs, NCCL on GPUs), so
``devices`` and ``num_nodes`` come from SLURM (``--ntasks-per-node``, ``--nodes``). For a job
that may be preempted or requeued:

- Lightning's own SLURM auto-requeue is off (``SLURMEnvironment(auto_requeue=False)``): it
  would save a Lightning ``hpc_ckpt`` inside its signal handler, in the middle of a step;
- ``OnRequestExit`` (SIGTERM, what SLURM sends on ``scontrol requeue``, a preemption or
  ``scancel``) stops training after the step in progress on every task, and
  ``BackupAndRestore`` writes that position; the script then exits with 143 and no result, and
  a job submitted with ``--requeue`` that SLURM starts again continues from the backup.

Rank 0 writes ``result.json`` (metrics, world size, SLURM job id) and ``final.pt`` into
``--out`` (default ``$SLURM_TRAIN_OUT``, else ``runs/slurm-<job id>``). Outside SLURM it trains
in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from torch import nn

from lit_amp import Model
from lit_amp.callbacks import BackupAndRestore, OnRequestExit
from lit_amp.demos import MLP, synthetic_loaders


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("SLURM_TRAIN_OUT"))
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--accelerator", default="cpu", help="cpu | gpu")
    args = p.parse_args()
    out = args.out or os.path.join("runs", f"slurm-{os.environ.get('SLURM_JOB_ID', 'local')}")

    L.seed_everything(0, verbose=False)  # every task builds the same initial network
    train, valid = synthetic_loaders(num_train=96, num_valid=32, batch_size=8)
    net = MLP(40, 100, 100, 10)
    trainer = {"accelerator": args.accelerator, "strategy": "ddp", "logger": False,
               "enable_progress_bar": False,
               "devices": int(os.environ.get("SLURM_NTASKS_PER_NODE", "1")),
               "num_nodes": int(os.environ.get("SLURM_NNODES", "1"))}
    if SLURMEnvironment.detect():
        trainer["plugins"] = [SLURMEnvironment(auto_requeue=False)]
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), 1e-2),
                  metrics={"acc", "loss"}, trainer=trainer)
    stop = OnRequestExit(save_ckpt=False, save_mindir=False)
    model.fit(args.epochs, train, valid,
              callbacks=[stop, BackupAndRestore(os.path.join(out, "backup"))])
    if stop.stopped_early:  # SLURM requeues a --requeue job: it resumes from the backup
        sys.exit(128 + stop.sig)
    metrics = {k: float(v) for k, v in model.eval(valid).items()}
    t = model.trainer
    if t.global_rank == 0:
        os.makedirs(out, exist_ok=True)
        torch.save({k: v.detach().cpu() for k, v in net.state_dict().items()},
                   os.path.join(out, "final.pt"))
        result = {"metrics": metrics, "world_size": t.world_size, "num_nodes": t.num_nodes,
                  "slurm_job_id": os.environ.get("SLURM_JOB_ID")}
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(result, f)
        print(f"world size {t.world_size}: {metrics}", flush=True)


if __name__ == "__main__":
    main()
