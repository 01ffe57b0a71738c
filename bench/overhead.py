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

import logging
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import (  # noqa: E402
    QUIET_TRAINER,
    Target,
    check_targets,
    machine,
    measure,
    parser,
    write_result,
)
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
    trainer = L.Trainer(max_epochs=EPOCHS, accelerator="cpu", devices=1, **QUIET_TRAINER)
    trainer.fit(PlainModule(), loader)


#: the median time over the hand loop's
TARGETS = (Target("Model.train (sink)", "<=", 1.05), Target("Model.train (non-sink)", "<=", 1.25))


def main() -> None:
    ap = parser(__doc__, doc_option=False)
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
    m = measure(variants, rounds=args.repeats, warmup=1)
    med = m.medians()
    base = med["hand loop"]
    ratios = {k: v / base for k, v in med.items()}
    print(f"{'variant':26s} {'median s':>9s} {'ratio':>7s} {'90 % interval':>15s}")
    for k in variants:
        lo_hi = "-".join(f"{x:.3f}" for x in m.interval(k))
        print(f"{k:26s} {med[k]:9.3f} {ratios[k]:7.3f} {lo_hi:>15s}")
    met = check_targets(TARGETS, ratios)
    path = write_result(
        "overhead",
        {
            "task": f"MLP 40-100-100-10, MNIST-1D, batch 100, {EPOCHS} epochs, CPU, fp32",
            "repeats": args.repeats,
            "median_seconds": med,
            "ratio_to_hand_loop": ratios,
            "ratio_interval_90": {k: m.interval(k) for k in variants},
            "targets": {t.name: t.goal for t in TARGETS},
            "targets_met": met,
            "all_seconds": m.rounds,
        },
    )
    print("machine:", machine())
    print("written:", path)


if __name__ == "__main__":
    main()
