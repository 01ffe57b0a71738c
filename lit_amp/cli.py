"""``lit-amp``: train the default experiment (MNIST-1D CNN through ``Model.fit``).

A first version with plain options; the Hydra configuration tree arrives with its own issue.

    lit-amp                       # what `make demo` runs
    lit-amp --epochs 10 --amp-level O2 --sink
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lit-amp", description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=30, help="final epoch number (default 30)")
    p.add_argument("--batch-size", type=int, default=100, help="batch size (default 100)")
    p.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate (default 1e-2)")
    p.add_argument(
        "--amp-level",
        default="O0",
        choices=["O0", "O1", "O2", "O3", "auto"],
        help="mixed-precision level (default O0)",
    )
    p.add_argument("--sink", action="store_true", help="dataset sink mode (one sink per epoch)")
    p.add_argument("--out", default="runs/demo", help="logs and checkpoints go here")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    return p


def main(argv: Sequence[str] | None = None) -> float:
    """Run the default experiment; returns the test accuracy (the optimized metric)."""
    args = build_parser().parse_args(argv)
    import torch
    from lightning.pytorch.loggers import CSVLogger
    from torch import nn

    from lit_amp import Model
    from lit_amp.callbacks import CheckpointConfig, LossMonitor, ModelCheckpoint, TimeMonitor
    from lit_amp.datasets import mnist1d_loaders
    from lit_amp.nets import CNN1D

    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    train, test = mnist1d_loaders(args.batch_size, seed=42)
    net = CNN1D()
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    out = os.path.abspath(args.out)
    model = Model(
        net,
        nn.CrossEntropyLoss(),
        opt,
        metrics={"acc", "loss"},
        amp_level=args.amp_level,
        trainer={"logger": CSVLogger(out, name="logs"), "default_root_dir": out},
    )
    ckpt_dir = os.path.join(out, "checkpoints")
    ckpt = ModelCheckpoint(
        prefix="mnist1d_cnn",
        directory=ckpt_dir,
        config=CheckpointConfig(save_checkpoint_steps=len(train) * 5, keep_checkpoint_max=2),
    )
    model.fit(
        args.epochs,
        train,
        test,
        valid_frequency=5,
        callbacks=[LossMonitor(per_print_times=len(train) * 5), TimeMonitor(), ckpt],
        dataset_sink_mode=args.sink,
    )
    result = model.eval(test)
    acc = float(result["acc"])
    print(f"test accuracy: {acc:.4f}  (loss {float(result['loss']):.4f})")
    print(f"wall time: {time.perf_counter() - t0:.1f} s")
    print(f"logs: {model.trainer.logger.log_dir if model.trainer.logger else out}")
    print(f"checkpoints: {ckpt_dir} (latest: {ckpt.latest_ckpt_file_name})")
    return acc


if __name__ == "__main__":  # pragma: no cover
    main()
