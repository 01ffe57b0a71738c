"""``Model.fit`` under DDP, the same script whether Lightning or torchrun starts the processes.

Lightning starts them (one machine, two processes; it re-runs this script for rank 1)::

    .venv/bin/python examples/ddp_model.py --devices 2

torchrun starts them (two nodes of one process each; on a cluster run the same line on every
node, with the first node's address as the endpoint)::

    torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d \\
        --rdzv-endpoint=HOST:29400 examples/ddp_model.py --devices 1 --num-nodes 2

Lightning finds torchrun's processes (``TorchElasticEnvironment``) and joins them; ``--devices``
x ``--num-nodes`` must equal torchrun's ``--nproc-per-node`` x ``--nnodes`` (Lightning refuses
anything else). Both launches split MNIST-1D (generated offline; ``--data synthetic``: data of
its shape made at once) over the two global ranks in the same way, so they train the same
batches and end with the same weights and test metrics (tests/cluster/test_torchrun.py checks
it). ``--out DIR`` writes ``final.pt`` (the weights) and ``metrics.json`` from rank 0.
"""

from __future__ import annotations

import argparse
import json
import os

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Subset

from lit_amp import Model
from lit_amp.demos import MLP, mnist1d_loaders, synthetic_loaders


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=2, help="processes per node")
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--accelerator", default="auto", help="cpu | gpu | auto")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--data", default="mnist1d", choices=["mnist1d", "synthetic"],
                   help="synthetic: MNIST-1D-shaped Gaussian clusters, made in milliseconds")
    p.add_argument("--train-samples", type=int, default=None,
                   help="train on the first N samples only (quick runs)")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--out", default=None, help="write final.pt and metrics.json here (rank 0)")
    args = p.parse_args()

    L.seed_everything(0, verbose=False)  # every rank builds the same initial network
    if args.data == "synthetic":
        train, test = synthetic_loaders(num_train=args.train_samples or 2000, num_valid=500,
                                        batch_size=args.batch_size)
    else:
        train, test = mnist1d_loaders(args.batch_size)
        if args.train_samples is not None:
            train = DataLoader(Subset(train.dataset, range(args.train_samples)),
                               batch_size=args.batch_size, shuffle=True,
                               generator=torch.Generator().manual_seed(42))
    net = MLP(40, 100, 100, 10)
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), args.lr),
                  metrics={"acc", "loss"},
                  trainer={"accelerator": args.accelerator, "devices": args.devices,
                           "num_nodes": args.num_nodes, "strategy": "ddp", "logger": False,
                           "enable_progress_bar": False})
    model.fit(args.epochs, train, test)
    metrics = {k: float(v) for k, v in model.eval(test).items()}
    trainer = model.trainer
    if trainer.global_rank == 0:
        print(f"world size {trainer.world_size} ({trainer.num_nodes} node(s) x "
              f"{trainer.num_devices} process(es)): {metrics}", flush=True)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            torch.save({k: v.detach().cpu() for k, v in net.state_dict().items()},
                       os.path.join(args.out, "final.pt"))
            with open(os.path.join(args.out, "metrics.json"), "w") as f:
                json.dump({**metrics, "world_size": trainer.world_size,
                           "num_nodes": trainer.num_nodes}, f)


if __name__ == "__main__":
    main()
