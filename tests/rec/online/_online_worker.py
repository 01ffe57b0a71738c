"""A resident online trainer for the crash and DDP tests (run as a subprocess).

Trains a tiny Wide&Deep from a DirectorySource and appends, after every step, one line
``step id id id ...`` (the record ids of the batch just trained) to ``--log``; prints the
OnlineSummary as JSON at the end. Under DDP (``LOCAL_RANK`` set by the test) each rank logs to
``--log`` + ``.rank{r}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch
from torch import nn

from lit_amp.callbacks import Callback
from lit_amp.rec import (
    CheckpointOptions,
    LazyAdam,
    PublishOptions,
    RecModel,
    ValidationOptions,
    WideDeep,
)
from lit_amp.rec.sources import DirectorySource


class LogEval(Callback):
    """Appends ``step metric=value ...`` after every validation (the eval callbacks' hook)."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "a", buffering=1)

    def on_eval_end(self, run_context):
        cb = run_context.original_args()
        metrics = cb.get("metrics") or {}
        self.f.write(f"{cb.cur_step_num} " + " ".join(f"{k}={v}" for k, v in metrics.items()))
        self.f.write("\n")


class LogIds(Callback):
    def __init__(self, path: str, sleep: float) -> None:
        self.f = open(path, "a", buffering=1)  # line-buffered: each line is written at once
        self.sleep = sleep

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        ids = cb.train_dataset_element[0]["record_id"].tolist()
        self.f.write(f"{cb.cur_step_num} {' '.join(map(str, ids))}\n")
        if self.sleep:
            time.sleep(self.sleep)


class SaveAt(Callback):
    """Rank 0 saves the network's state at the end of step ``step`` to ``path``."""

    def __init__(self, net: nn.Module, step: int, path: str) -> None:
        self.net, self.step, self.path = net, step, path

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == self.step and \
                os.environ.get("LOCAL_RANK", "0") == "0":
            torch.save(self.net.state_dict(), self.path)


def _fail_writes_after(n: int) -> None:
    """Versioned publish files fail to write (``OSError``, as on a full disk) after ``n``."""
    from lit_amp.rec.serving.writer import DeltaPublisher

    real, calls = DeltaPublisher._write_file, [0]

    def write(payload, path):
        calls[0] += 1
        if calls[0] > n:
            raise OSError(28, "No space left on device (the test's full disk)", path)
        return real(payload, path)

    DeltaPublisher._write_file = staticmethod(write)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--batch", type=int, default=40)
    p.add_argument("--ckpt-every", type=int, default=4)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--max-idle", type=float, default=1.0)
    p.add_argument("--ddp", type=int, default=0)
    p.add_argument("--wait-for", default=None, help="start training once this file exists")
    p.add_argument("--delete-consumed", action="store_true")
    p.add_argument("--valid-every", type=int, default=0, help="validate on a held-out window")
    p.add_argument("--sgd", type=float, default=0.0, help="SGD with this lr instead of Adam")
    p.add_argument("--loss-function", action="store_true", help="a plain function as loss_fn")
    p.add_argument("--accumulate", type=int, default=1, help="boost grad_accumulation_step")
    p.add_argument("--save-weights", default=None, help="torch.save the final weights here")
    p.add_argument("--delta-publish", default=None,
                   help="publish deltas here every 2 steps, a full snapshot every 3 publishes")
    p.add_argument("--fail-publish-after", type=int, default=None,
                   help="rank 0's versioned-file writes fail (disk full) after this many")
    p.add_argument("--full-every", type=int, default=1, help="full_every_n_checkpoints")
    p.add_argument("--save-weights-at", type=int, default=None,
                   help="rank 0 saves the weights of this step to --save-weights + .step")
    a = p.parse_args()
    if a.fail_publish_after is not None and os.environ.get("LOCAL_RANK", "0") == "0":
        _fail_writes_after(a.fail_publish_after)
    if a.wait_for:  # started early so that the imports above overlap another run
        while not os.path.exists(a.wait_for):
            time.sleep(0.02)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # --delta-publish: sparse rows of a larger table, so that a delta holds only touched rows
    rows = 10_000 if a.delta_publish else 64
    net = WideDeep(vocab_size=rows, embed_dim=4, hidden=(16,), sparse=bool(a.delta_publish))
    trainer = None
    log = a.log
    if a.ddp:
        trainer = {"accelerator": "cpu", "devices": a.ddp, "strategy": "ddp"}
        log = f"{a.log}.rank{os.environ['LOCAL_RANK']}"
    metrics = {"auc", "loss"} if a.valid_every else None
    opt = (torch.optim.SGD(net.parameters(), a.sgd) if a.sgd
           else LazyAdam(net.parameters(), 1e-2) if a.delta_publish
           else torch.optim.Adam(net.parameters(), 1e-2))
    loss_fn = nn.functional.binary_cross_entropy_with_logits if a.loss_function else (
        nn.BCEWithLogitsLoss())
    model = RecModel(net, loss_fn, opt, metrics=metrics, trainer=trainer)
    boost = []
    if a.accumulate > 1:
        from lit_amp.boost import AutoBoost

        boost = [AutoBoost("O0", {"boost": {"mode": "manual", "grad_accumulation": True},
                                  "grad_accumulation": {"grad_accumulation_step": a.accumulate}})]
    valid = ValidationOptions(valid_every_n_steps=a.valid_every) if a.valid_every else None
    src = DirectorySource(
        a.data,
        batch_size=a.batch,
        max_idle_s=a.max_idle,
        poll_interval=0.02,
        delete_consumed=a.delete_consumed,
    )
    summary = model.online_train(
        src,
        callbacks=[LogIds(log, a.sleep), *([LogEval(log + ".eval")] if a.valid_every else []),
                   *boost, *([SaveAt(net, a.save_weights_at, f"{a.save_weights}.step")]
                             if a.save_weights_at else [])],
        checkpoint=CheckpointOptions(
            a.ckpt, ckpt_every_n_steps=a.ckpt_every, keep_checkpoint_max=3,
            full_every_n_checkpoints=a.full_every,
        ),
        validation=valid,
        publish=None if a.delta_publish is None else PublishOptions(
            a.delta_publish, publish_every_n_steps=2, delta=True, full_every_n_publishes=3),
    )
    if a.save_weights:
        torch.save(net.state_dict(), a.save_weights)
    print("SUMMARY " + json.dumps(dataclasses.asdict(summary)), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
