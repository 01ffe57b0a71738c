"""lit_amp inside your own Lightning ``Trainer`` script: LitModel + AmpPrecision + AutoBoost + THOR.

No ``Model`` facade here: ``LitModel`` is a LightningModule built from MindSpore's ``Model``
arguments, ``AmpPrecision("O2")`` is a Lightning precision plugin computing MindSpore's O2 level
(float32 storage, 16-bit compute, BatchNorm in float32, dynamic loss scaling for float16),
``AutoBoost("O1")`` is a Lightning callback applying MindSpore's boost O1 algorithms (LessBN,
gradient freezing), and ``thor(net, ...)`` is the second-order THOR optimizer built from the
network with MindSpore's lr/damping schedules. Everything else is plain Lightning: the
progress bar, CSVLogger, ``trainer.validate``.

Run: ``.venv/bin/python examples/lightning_trainer.py [--optimizer thor|adam] [--amp O2]
[--boost O1] [--epochs 3] [--devices 2 --strategy ddp]``

With ``--strategy ddp`` Lightning re-runs this script for each process, so every process holds
the whole trained state (optimizer, loss scale, boost) for ``trainer.validate``. ``ddp_spawn``
and ``ddp_fork`` are refused by ``LitModel`` at fit start (each worker raises a ValueError
naming ``'ddp'``, which ``trainer.fit`` re-raises here): their workers would send back only the
weights.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn

from lit_amp import AmpPrecision, LitModel
from lit_amp.demos import CNN1D, mnist1d_loaders


def main(argv: list[str] | None = None) -> dict:
    """Fit and validate; returns the validation metrics."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--optimizer", default="thor", choices=["thor", "adam"])
    p.add_argument("--amp", default="O2", help="AMP level for AmpPrecision (O0 to disable)")
    p.add_argument("--boost", default="O1", help="boost level for AutoBoost (O0 to disable)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--strategy", default="auto")
    p.add_argument("--out", default="runs/lightning_trainer")
    args = p.parse_args(argv)
    L.seed_everything(0, verbose=False)
    train, valid = mnist1d_loaders(100)
    net = CNN1D(batch_norm=True)

    if args.optimizer == "thor":
        from lit_amp.thor import get_thor_damping, get_thor_lr, thor

        steps = len(train)
        lr = get_thor_lr(0, 0.05, 2.0, total_epochs=2 * args.epochs, steps_per_epoch=steps)
        damping = get_thor_damping(0, 0.03, 0.87, total_epochs=2 * args.epochs,
                                   steps_per_epoch=steps)
        opt: torch.optim.Optimizer = thor(net, lr, damping, momentum=0.9, batch_size=100,
                                          frequency=10)
    else:
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)

    # AMP comes from the plugin, so the LitModel itself stays at O0
    lit = LitModel(net, nn.CrossEntropyLoss(), opt, metrics={"acc", "loss"})
    plugins = [AmpPrecision(args.amp)] if args.amp != "O0" else []
    callbacks: list[L.Callback] = []
    if args.boost != "O0":
        from lit_amp.boost import AutoBoost

        callbacks.append(AutoBoost(args.boost))
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="auto",
        devices=args.devices,
        strategy=args.strategy,
        plugins=plugins,
        callbacks=callbacks,
        logger=CSVLogger(args.out, name="logs"),
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(lit, train, valid)
    metrics = trainer.validate(lit, valid, verbose=False)[0]
    print(f"validation: {metrics}  (logs: {trainer.logger.log_dir})")
    return metrics


if __name__ == "__main__":
    main()
