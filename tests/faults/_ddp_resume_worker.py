"""Worker for tests/faults/test_ddp_resume_exactly_once.py: ``Model.train`` under 2-process DDP.

``python tests/faults/_ddp_resume_worker.py WORK [EPOCH:STEP]`` trains ``EPOCHS`` epochs of a
seeded shuffling DataLoader with ``OnRequestExit`` + ``BackupAndRestore`` (Lightning's launcher
re-runs the script for rank 1). Each rank appends ``[epoch, step_in_epoch, sample ids]`` per
step to ``WORK/trained{rank}.jsonl`` and writes its pid to ``WORK/pid{rank}``; rank 0 saves
the final weights to ``WORK/final.pt``. With ``EPOCH:STEP`` each rank, at that step's end,
writes ``WORK/ready{rank}`` and waits for ``WORK/sent`` (the test sends SIGTERM to one or
both ranks in between). The net draws from torch's (dropout), numpy's and Python's global
generators, seeded differently per rank.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

EPOCHS, N, BATCH = 4, 64, 4  # 8 batches per rank and epoch, 32 steps


class Noise(nn.Module):
    """Adds noise from numpy's and Python's global generators."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + float(np.random.randn()) * 1e-2 + random.random() * 1e-2


def main(work: Path, stop_at: tuple[int, int] | None) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    from lit_amp import Model
    from lit_amp.callbacks import BackupAndRestore, LambdaCallback, OnRequestExit

    rank = int(os.environ.get("LOCAL_RANK", "0"))
    (work / f"pid{rank}").write_text(str(os.getpid()))
    torch.manual_seed(0)
    x = torch.randn(N, 5)
    x[:, 0] = torch.arange(N) * 1e-3  # the sample id, readable back from a batch
    y = (x[:, 1] > 0).long()
    data = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True,
                      generator=torch.Generator().manual_seed(7))
    net = nn.Sequential(Noise(), nn.Linear(5, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2))
    torch.manual_seed(100 + rank)  # every rank its own random streams
    np.random.seed(100 + rank)
    random.seed(100 + rank)
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), 1e-2),
                  trainer={"logger": False, "enable_checkpointing": False,
                           "accelerator": "cpu", "devices": 2, "strategy": "ddp"})
    exit_cb = OnRequestExit(directory=str(work / "exit"))
    log = open(work / f"trained{rank}.jsonl", "a")

    def step_begin(rc) -> None:
        cb = rc.original_args()
        ids = [round(v * 1e3) for v in cb.train_dataset_element[0][:, 0].tolist()]
        step = (cb.cur_step_num - 1) % cb.batch_num + 1
        log.write(json.dumps([cb.cur_epoch_num, step, ids]) + "\n")
        log.flush()

    def step_end(rc) -> None:
        cb = rc.original_args()
        step = (cb.cur_step_num - 1) % cb.batch_num + 1
        if stop_at is not None and (cb.cur_epoch_num, step) == stop_at:
            (work / f"ready{rank}").write_text("1")
            deadline = time.time() + 60
            while not (work / "sent").exists() and time.time() < deadline:
                time.sleep(0.01)
            time.sleep(0.1)

    model.train(EPOCHS, data, callbacks=[
        LambdaCallback(on_train_step_begin=step_begin, on_train_step_end=step_end),
        exit_cb, BackupAndRestore(str(work / "backup"))], dataset_sink_mode=False)
    log.close()
    if rank == 0:
        torch.save(net.state_dict(), work / "final.pt")
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    _stop = tuple(int(v) for v in sys.argv[2].split(":")) if len(sys.argv) > 2 else None
    main(Path(sys.argv[1]), _stop)
