"""An online trainer whose background checkpoint writes are slow, for the kill -9 test.

Trains a tiny Wide&Deep (LazyAdam; its tables copied on write) from a DirectorySource that
deletes the files a durable checkpoint covers; after every step appends ``step id id ...`` to
``--log``. With ``--slow S``, every background write from the ``--slow-from``-th (2) on sleeps
``S`` seconds per chunk it writes and, as it starts, writes the checkpoint's path to
``--marker``. ``--full-every N``: row increments between whole checkpoints. Prints
``SUMMARY {json}`` at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

from lit_amp.callbacks import Callback
from lit_amp.rec import CheckpointOptions, LazyAdam, RecModel, WideDeep
from lit_amp.rec.state import snapshot
from lit_amp.rec.sources import DirectorySource


class LogIds(Callback):
    def __init__(self, path: str, sleep: float) -> None:
        self.f = open(path, "a", buffering=1)
        self.sleep = sleep

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        ids = cb.train_dataset_element[0]["record_id"].tolist()
        self.f.write(f"{cb.cur_step_num} {' '.join(map(str, ids))}\n")
        if self.sleep:
            time.sleep(self.sleep)


def slow_writes(seconds: float, marker: str, first: int = 2) -> None:
    """Every background write from the ``first``-th on is slow and announces itself in
    ``marker``."""
    snapshot.MIN_PROTECTED_BYTES, snapshot.CHUNK_BYTES = 0, 1024
    write, as_bytes = snapshot.Snapshot.write, snapshot.as_bytes
    writes = []

    def announced(self, path):
        writes.append(path)
        if len(writes) >= first:
            Path(marker).write_text(str(path))
        return write(self, path)

    def slow(t):
        if len(writes) >= first:
            time.sleep(seconds)
        return as_bytes(t)

    snapshot.Snapshot.write, snapshot.as_bytes = announced, slow


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--ckpt-every", type=int, default=3)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--slow", type=float, default=0.0)
    p.add_argument("--marker", default="")
    p.add_argument("--slow-from", type=int, default=2)
    p.add_argument("--full-every", type=int, default=1)
    a = p.parse_args()
    if a.slow:
        slow_writes(a.slow, a.marker, a.slow_from)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = WideDeep(vocab_size=64, embed_dim=4, hidden=(16,), sparse=True)
    model = RecModel(net, nn.BCEWithLogitsLoss(), LazyAdam(net.parameters(), 1e-2))
    src = DirectorySource(a.data, batch_size=a.batch, max_idle_s=0.5, poll_interval=0.02,
                          delete_consumed=True)
    summary = model.online_train(
        src, callbacks=[LogIds(a.log, a.sleep)], dataset_sink_mode=False,
        checkpoint=CheckpointOptions(a.ckpt, ckpt_every_n_steps=a.ckpt_every,
                                     keep_checkpoint_max=3,
                                     full_every_n_checkpoints=a.full_every),
    )
    print("SUMMARY " + json.dumps(dataclasses.asdict(summary)), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
