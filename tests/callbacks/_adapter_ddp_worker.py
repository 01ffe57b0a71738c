"""Worker script for tests/callbacks/test_adapter.py: to_lightning under Lightning's DDP.

A user's own LightningModule (``val_acc`` logged without ``sync_dist``, so the ranks differ)
with ``to_lightning([LossMonitor, History, EarlyStopping(monitor="val_acc")])`` on 2 CPU
processes (gloo). A script, because Lightning's launcher re-runs it (same argv) for rank 1.
Each rank writes ``OUT/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from lit_amp.callbacks import EarlyStopping, History, LossMonitor, to_lightning  # noqa: E402
from tests.helpers.data import make_batches, make_net  # noqa: E402


class PlainModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = make_net()
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), 0.5)


def _loader(n_batches: int, seed: int) -> DataLoader:
    xs, ys = zip(*make_batches(n_batches, seed=seed))
    return DataLoader(TensorDataset(torch.cat(xs), torch.cat(ys)), batch_size=16)


def main(out: str) -> None:
    history = History()
    es = EarlyStopping(monitor="val_acc", patience=0, min_delta=2.0)
    module = PlainModule()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=5,
                        accumulate_grad_batches=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=out,
                        callbacks=[to_lightning([LossMonitor(1), history, es])])
    trainer.fit(module, _loader(8, 0), _loader(4, 1))
    res = {"epoch": trainer.current_epoch, "stopped_epoch": es.stopped_epoch, "best": es.best,
           "val_acc": history.history["val_acc"], "losses": module.losses,
           "net_output": history.history["net_output"]}
    with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1])
