"""The boost benchmarks' shared workload (``bench/boost.py``, ``bench/boost_phases.py``): the
ResNet1D on MNIST-1D, the variants compared, and one training run of a variant (single process
or one rank of DDP). ``WIDTH`` and ``BATCH`` are set by the scripts' options."""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import torch
from torch import nn

from bench._common import QUIET_TRAINER, Target

EPOCHS = 8
BATCH = 100
WIDTH, BLOCKS = 32, (2, 2, 2)
LR, MOMENTUM, WD = 0.05, 0.9, 5e-4

SINGLE: dict[str, Any] = {
    "O0": None,
    "O1": ("O1", None),
    "LessBN only": ("O0", {"boost": {"mode": "manual", "less_bn": True}}),
    "LessBN BN-removal only": (
        "O0",
        {
            "boost": {"mode": "manual", "less_bn": True},
            "less_bn": {"fn_flag": False, "gc_flag": False},
        },
    ),
    "GradientFreeze only": ("O0", {"boost": {"mode": "manual", "grad_freeze": True}}),
}
DDP: dict[str, Any] = {
    "DDP O0": None,
    "DDP O2": ("O2", None),
    # the same O2 with AdaSum's deltas sent through gloo instead of shared memory
    "DDP O2, gloo exchange": ("O2", None, {"adasum": {"transport": "process_group"}}),
    "DDP O1": ("O1", None),
    "DDP AdaSum only": ("O0", {"boost": {"mode": "manual", "adasum": True}}),
}
#: issue #6: O1 against O0 (single process), O2 against plain DDP (2 processes)
TARGETS = (Target("O1: speedup, wall", ">=", 1.20), Target("O1: accuracy drop (pts)", "<=", 0.5),
           Target("DDP O2: speedup, wall", ">=", 1.30),
           Target("DDP O2: accuracy drop (pts)", "<=", 3.0))


def target_values(s_sum: dict, d_sum: dict) -> dict[str, float | None]:
    """The values :data:`TARGETS` judge, from the single-process and DDP summaries."""
    out: dict[str, float | None] = {}
    for label, row in (("O1", s_sum.get("O1")), ("DDP O2", d_sum.get("DDP O2"))):
        out[f"{label}: speedup, wall"] = row and row["speedup_wall_median"]
        out[f"{label}: accuracy drop (pts)"] = row and -row["acc_delta_pts_mean"]
    return out


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "lit_amp"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _data() -> dict[str, torch.Tensor]:
    from lit_amp.demos import mnist1d_arrays

    d = mnist1d_arrays()
    return {
        "x": torch.as_tensor(d["x"], dtype=torch.float32),
        "y": torch.as_tensor(d["y"], dtype=torch.long),
        "x_test": torch.as_tensor(d["x_test"], dtype=torch.float32),
        "y_test": torch.as_tensor(d["y_test"], dtype=torch.long),
    }


def _callbacks(epochs: int, steps_per_epoch: int):
    import lightning as L

    class Cosine(L.Callback):
        """Cosine LR over the run (set per batch on every param group)."""

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            total = epochs * steps_per_epoch
            t = min(trainer.global_step, total)
            lr = 0.5 * LR * (1 + torch.cos(torch.tensor(t / total * 3.141592653589793)).item())
            for opt in trainer.optimizers:
                for g in opt.param_groups:
                    g["lr"] = lr

    class Timer(L.Callback):
        """Wall and CPU seconds from the start of epoch 1 to the end of training."""

        def __init__(self) -> None:
            self.t0 = self.c0 = None
            self.wall = self.cpu = 0.0

        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 1:
                self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_train_end(self, trainer, pl_module):
            self.wall = time.perf_counter() - self.t0
            self.cpu = time.process_time() - self.c0

    return Cosine(), Timer()


def _run(variant: Any, seed: int, epochs: int, data: dict, ddp_world: int = 0) -> dict:
    """One training run; returns samples/s (wall, cpu), accuracy and counters."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from lit_amp import LitModel
    from lit_amp.boost import AutoBoost
    from lit_amp.demos import ResNet1D

    torch.manual_seed(seed)
    net = ResNet1D(WIDTH, BLOCKS)
    n_bn = sum(isinstance(m, nn.BatchNorm1d) for m in net.modules())
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    lit = LitModel(net, nn.CrossEntropyLoss(), opt)
    lit.log_train_loss = False
    per_rank = BATCH // max(1, ddp_world)
    n = len(data["x"])
    steps = n // BATCH
    cosine, timer = _callbacks(epochs, steps)
    callbacks: list = [cosine, timer]
    boost = None
    if variant is not None:
        boost = AutoBoost(*variant[:2])
        for algo, attrs in (variant[2] if len(variant) > 2 else {}).items():
            for key, value in attrs.items():
                setattr(boost.get_algorithm(algo), key, value)
        callbacks.insert(0, boost)
    kw: dict[str, Any] = {"accelerator": "cpu", "devices": 1}
    if ddp_world:
        from lightning.pytorch.strategies import DDPStrategy

        kw = {"accelerator": "cpu", "devices": ddp_world, "strategy": DDPStrategy()}
    trainer = L.Trainer(max_epochs=epochs, callbacks=callbacks, **QUIET_TRAINER, **kw)
    loader = DataLoader(
        TensorDataset(data["x"], data["y"]),
        batch_size=per_rank,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        drop_last=True,
    )
    trainer.fit(lit, loader)
    net.eval()
    with torch.no_grad():
        acc = (net(data["x_test"]).argmax(1) == data["y_test"]).float().mean().item()
    samples = (epochs - 1) * steps * BATCH  # global samples timed
    out = {
        "samples_per_s": samples / timer.wall,
        "cpu_seconds": timer.cpu,
        "wall_seconds": timer.wall,
        "acc": acc,
        "bn_layers": sum(isinstance(m, nn.BatchNorm1d) for m in net.modules()),
        "bn_layers_before": n_bn,
    }
    if boost is not None and boost.get_algorithm("grad_freeze") is not None:
        gf = boost.get_algorithm("grad_freeze")
        sched = gf.schedule[: gf.position]
        out["frozen_step_fraction"] = float((sched != 0).mean())
        total = sum(p.numel() for p in gf.sets[0])
        frozen = [total - sum(p.numel() for p in gf.sets[int(k)]) for k in sched]
        out["mean_frozen_param_fraction"] = float(sum(frozen) / len(frozen) / total)
        out["train_sets"] = len(gf.sets)
    if boost is not None and boost.get_algorithm("adasum") is not None:
        out["adasum_steps"] = boost.get_algorithm("adasum").steps
        out["adasum_transport"] = boost.get_algorithm("adasum").transport_used
    return out
