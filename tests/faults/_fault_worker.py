"""A resident online trainer for the fault tests (run as a subprocess, alone or under DDP).

Trains a tiny Wide&Deep from a DirectorySource; after every step appends ``step id id ...`` to
``--log`` (``.rank{r}`` under DDP); prints ``SUMMARY {json}`` at the end. ``--stall-rank R
--stall-step S`` makes rank R sleep for a long time at step S (a stalled rank).
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
from lit_amp.rec import CheckpointOptions, RecModel, StopOptions, WideDeep
from lit_amp.rec.sources import DirectorySource


class LogIds(Callback):
    def __init__(self, path: str, sleep: float, stall_step: int) -> None:
        self.f = open(path, "a", buffering=1)
        self.sleep = sleep
        self.stall_step = stall_step

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        ids = cb.train_dataset_element[0]["record_id"].tolist()
        self.f.write(f"{cb.cur_step_num} {' '.join(map(str, ids))}\n")
        if cb.cur_step_num == self.stall_step:
            time.sleep(600)
        if self.sleep:
            time.sleep(self.sleep)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--ckpt-every", type=int, default=3)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--max-idle", type=float, default=0.5)
    p.add_argument("--ddp", type=int, default=0)
    p.add_argument("--peer-timeout", type=float, default=300.0)
    p.add_argument("--stall-rank", type=int, default=-1)
    p.add_argument("--stall-step", type=int, default=-1)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = WideDeep(vocab_size=64, embed_dim=4, hidden=(16,))
    trainer, log, rank = None, a.log, 0
    if a.ddp:
        trainer = {"accelerator": "cpu", "devices": a.ddp, "strategy": "ddp"}
        rank = int(os.environ["LOCAL_RANK"])
        log = f"{a.log}.rank{rank}"
    model = RecModel(net, nn.BCEWithLogitsLoss(), torch.optim.Adam(net.parameters(), 1e-2),
                     trainer=trainer)
    src = DirectorySource(a.data, batch_size=a.batch, max_idle_s=a.max_idle, poll_interval=0.02)
    summary = model.online_train(
        src,
        callbacks=[LogIds(log, a.sleep, a.stall_step if rank == a.stall_rank else -1)],
        checkpoint=CheckpointOptions(a.ckpt, ckpt_every_n_steps=a.ckpt_every,
                                     keep_checkpoint_max=3),
        stop=StopOptions(peer_timeout=a.peer_timeout),
        dataset_sink_mode=False,
    )
    print("SUMMARY " + json.dumps(dataclasses.asdict(summary)), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
