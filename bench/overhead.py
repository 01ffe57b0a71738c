"""Benchmark: framework overhead of Model.train against a hand-written PyTorch loop (issue #2).

Small MLP (40-100-100-10) on MNIST-1D, batch 100, CPU. Each variant is a whole 20-epoch run,
set-up included (model, optimizer and trainer construction); the variants run interleaved,
warm-up excluded, and the median of the repeats is reported as a ratio to the hand loop.

    make bench            # or: .venv/bin/python bench/overhead.py --repeats 7

Variants: hand-written loop; Model.train (non-sink); Model.train (sink mode, sink_size = steps
per epoch); plain Lightning Trainer.fit of an equivalent LightningModule (automatic
optimization, default Trainer flags except progress bar/logger/checkpointing off).
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, machine, medians, write_result  # noqa: E402

from lit_amp import Model  # noqa: E402
from lit_amp.demos import MLP, mnist1d_loaders  # noqa: E402

EPOCHS = 20


def make():
    torch.manual_seed(0)
    net = MLP(40, 100, 100, 10)
    return net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)


def hand_loop(loader) -> None:
    net, loss_fn, opt = make()
    net.train()
    for _ in range(EPOCHS):
        for x, y in loader:
            loss = loss_fn(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


def model_train(loader, sink: bool) -> None:
    net, loss_fn, opt = make()
    model = Model(net, loss_fn, opt)
    model.train(EPOCHS, loader, dataset_sink_mode=sink, sink_size=len(loader) if sink else -1)


class PlainModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net, self.loss_fn, self._opt = make()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.loss_fn(self.net(x), y)

    def configure_optimizers(self):
        return self._opt


def plain_lightning(loader) -> None:
    trainer = L.Trainer(
        max_epochs=EPOCHS,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(PlainModule(), loader)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    loader, _ = mnist1d_loaders(100)
    variants = {
        "hand loop": lambda: hand_loop(loader),
        "Model.train (sink)": lambda: model_train(loader, True),
        "Model.train (non-sink)": lambda: model_train(loader, False),
        "plain Lightning": lambda: plain_lightning(loader),
    }
    times = interleaved(variants, repeats=args.repeats, warmup=1)
    med = medians(times)
    base = med["hand loop"]
    ratios = {k: v / base for k, v in med.items()}
    targets = {"Model.train (sink)": 1.05, "Model.train (non-sink)": 1.25}
    print(f"{'variant':26s} {'median s':>9s} {'ratio':>7s} {'target':>7s}")
    for k in variants:
        t = targets.get(k)
        tgt = f"<= {t:.2f}" if t else ""
        print(f"{k:26s} {med[k]:9.3f} {ratios[k]:7.3f} {tgt:>7s}")
    path = write_result(
        "overhead",
        {
            "task": f"MLP 40-100-100-10, MNIST-1D, batch 100, {EPOCHS} epochs, CPU, fp32",
            "repeats": args.repeats,
            "median_seconds": med,
            "ratio_to_hand_loop": ratios,
            "targets": targets,
            "all_seconds": times,
        },
    )
    print("machine:", machine())
    print("written:", path)


if __name__ == "__main__":
    main()
