"""A Lightning callback the torchrun tests add to a ``lit-amp`` run: one rank dies mid-training.

``KillWorker(rank, step, marker)`` SIGKILLs the worker of global rank ``rank`` at the end of
training step ``step`` (Lightning's ``global_step``), once per ``marker`` file: it writes the
time and its pid there first, so a group that torchrun restarts trains on without dying again.
Configured through ``lit-amp '+callbacks.kill={_target_: tests.cluster._kill_worker.KillWorker,
...}' '+extra_trusted_targets=[tests.cluster.*]'``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import lightning as L


class KillWorker(L.Callback):
    """SIGKILL this process at ``(rank, step)``, the first time only (see the module docstring).

    Args:
        rank: the global rank that dies.
        step: the training step after which it dies.
        marker: a file written just before the kill (``"<time> <pid>"``); when it exists,
            nothing is killed.
    """

    def __init__(self, rank: int, step: int, marker: str) -> None:
        self.rank, self.step, self.marker = rank, step, Path(marker)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           outputs: object, batch: object, batch_idx: int) -> None:
        if (trainer.global_rank != self.rank or trainer.global_step != self.step
                or self.marker.exists()):
            return
        self.marker.write_text(f"{time.time()} {os.getpid()}")
        os.kill(os.getpid(), signal.SIGKILL)
