"""Online training of Wide&Deep from a folder that a producer process keeps filling.

A producer process writes Criteo-like click files (``SyntheticClickSource`` records, 13 dense
and 26 categorical features) into ``WORKDIR/data`` at ``--rate`` records per second, each
with write-then-rename. The trainer tails the folder with ``DirectorySource`` and runs
``RecModel.online_train``: it checkpoints (weights + optimizer + stream cursor) every
``--ckpt-every`` seconds, publishes serving weights every ``--publish-every`` seconds, and
prints the loss and a progressive AUC — each batch is scored *before* it is trained on, into a
binned, constant-memory AUC over a sliding window of the last 50,000 records.

    .venv/bin/python examples/online_train.py --seconds 30
    .venv/bin/python examples/online_train.py --workdir /tmp/online --seconds 30   # again:
                                                          # resumes from the checkpoint

Stop it early with Ctrl-C or ``touch WORKDIR/STOP``: it finishes the step, checkpoints and
publishes before exiting. Re-running with the same ``--workdir`` resumes where it stopped.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import tempfile
import time

import torch
from torch import nn

from lit_amp.callbacks import Callback, RunContext
from lit_amp.rec import (
    CheckpointOptions,
    LazyAdam,
    PublishOptions,
    RecModel,
    SlidingWindowAUC,
    StopOptions,
    WideDeep,
    load_published,
)
from lit_amp.rec.sources import DirectorySource, SyntheticClickSource, write_shard


def producer(
    data_dir: str, rate: float, file_records: int, seed: int, stop: mp.Event, ready: mp.Event
) -> None:
    """Write ``file_records``-record files at ``rate`` records/s until ``stop`` is set."""
    gen = SyntheticClickSource(batch_size=file_records, seed=seed)
    ready.set()
    existing = [n for n in os.listdir(data_dir) if n.startswith("part-")]
    i = len(existing)  # continue the numbering after a restart
    t0 = time.monotonic()
    while not stop.is_set():
        write_shard(data_dir, f"part-{i:08d}", gen.columns(i), "npz")
        i += 1
        wait = t0 + (i - len(existing)) * file_records / rate - time.monotonic()
        if wait > 0:
            stop.wait(wait)


class ProgressiveAUC(Callback):
    """Scores each incoming batch before it is trained on; prints loss and windowed AUC."""

    def __init__(self, network: nn.Module, every: int = 20, window: int = 50_000) -> None:
        self.network = network
        self.every = every
        self.auc = SlidingWindowAUC(window=window, num_chunks=10, num_bins=1000)

    def on_train_step_begin(self, run_context: RunContext) -> None:
        features, label = run_context.original_args().train_dataset_element
        was_training = self.network.training
        self.network.eval()
        with torch.no_grad():
            self.auc.update(self.network(features), label)
        self.network.train(was_training)

    def on_train_step_end(self, run_context: RunContext) -> None:
        cb = run_context.original_args()
        if cb.cur_step_num % self.every == 0:
            print(
                f"step {cb.cur_step_num:6d}  loss {float(cb.net_outputs):.4f}  "
                f"AUC(last {self.auc.window} records) {float(self.auc.compute()):.4f}",
                flush=True,
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default=None, help="data, checkpoints, published weights")
    p.add_argument("--seconds", type=float, default=30.0, help="stop after this long")
    p.add_argument("--rate", type=float, default=10_000.0, help="producer records per second")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--file-records", type=int, default=1000)
    p.add_argument("--publish-every", type=float, default=2.0, help="seconds")
    p.add_argument("--ckpt-every", type=float, default=10.0, help="seconds")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the trainer")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("lightning").setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)

    workdir = args.workdir or tempfile.mkdtemp(prefix="lit_amp_online_")
    data, ckpt, publish = (os.path.join(workdir, d) for d in ("data", "ckpt", "publish"))
    os.makedirs(data, exist_ok=True)
    print(f"workdir: {workdir}")

    ctx = mp.get_context("spawn")
    stop, ready = ctx.Event(), ctx.Event()
    prod = ctx.Process(
        target=producer, args=(data, args.rate, args.file_records, 0, stop, ready), daemon=True
    )
    prod.start()
    ready.wait(timeout=120)  # the producer's imports take a few seconds

    torch.manual_seed(0)
    net = WideDeep(vocab_size=10_000, embed_dim=16, hidden=(256, 128), sparse=True)
    model = RecModel(net, nn.BCEWithLogitsLoss(), LazyAdam(net.parameters(), lr=1e-3))
    source = DirectorySource(data, batch_size=args.batch, poll_interval=0.02, linger_s=1.0)
    try:
        summary = model.online_train(
            source,
            callbacks=[ProgressiveAUC(net)],
            stop=StopOptions(max_time=args.seconds, stop_file=os.path.join(workdir, "STOP")),
            checkpoint=CheckpointOptions(ckpt, ckpt_every_n_seconds=args.ckpt_every),
            publish=PublishOptions(publish, publish_every_n_seconds=args.publish_every),
        )
    finally:
        stop.set()
        prod.join(timeout=10)
    rate = summary.records / max(summary.elapsed_s, 1e-9)
    print(
        f"\nstopped: {summary.stop_reason}; {summary.steps} steps, {summary.records} records "
        f"in {summary.elapsed_s:.1f} s ({rate:,.0f} records/s); total step {summary.total_steps}"
        f"{'; resumed from ' + summary.resumed_from if summary.resumed_from else ''}"
    )
    print(f"malformed records: {source.malformed}; checkpoint: {summary.last_checkpoint}")

    # what a serving process does: load the newest published weights
    if summary.last_published is None and not os.path.exists(os.path.join(publish, "LATEST")):
        print("nothing was published (no record arrived in time)")
        return
    serving = WideDeep(vocab_size=10_000, embed_dim=16, hidden=(256, 128))
    payload = load_published(publish, serving)
    held_out = SyntheticClickSource(batch_size=20_000, seed=0)
    features, label = held_out.schema.to_batch(held_out.columns(10**7))  # never produced
    auc = SlidingWindowAUC(window=20_000, num_chunks=1)
    with torch.no_grad():
        auc.update(serving.eval()(features), label)
    print(
        f"published step {payload['step']} ({payload['records']} records): held-out AUC "
        f"{float(auc.compute()):.4f}"
    )


if __name__ == "__main__":
    main()
