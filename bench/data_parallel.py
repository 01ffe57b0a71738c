"""Benchmark: ``Model.train`` data parallel on 2 CPU processes (gloo), issue #17.

(a) sink vs non-sink: per-sample throughput of ``Model.train`` under ``'ddp'`` on the same
    network and data, one epoch of ``--sink-steps`` steps per rank either as ``--sink-steps``
    Lightning steps (non-sink) or as one sink of ``--sink-steps`` steps (sink mode). Timed from
    the epoch's start to its end on rank 0 (Trainer set-up excluded), median of ``--repeats``
    interleaved rounds.
(b) FSDP2 vs DDP on an MLP whose parameters dominate (~6.3 M parameters): median step time
    (``on_train_batch_start`` to ``on_train_batch_end`` on rank 0, first steps of each call
    excluded) and each rank's bytes of local parameter storage and of optimizer state (Adam).

The script runs as 2 processes: Lightning's launcher re-runs it for rank 1. The load average
is recorded before and after (the machine may be shared).

    .venv/bin/python bench/data_parallel.py            # ~2 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import parser, write_result  # noqa: E402

CPU2 = {"accelerator": "cpu", "devices": 2}


class Clock(L.Callback):
    """Per-epoch and per-step wall times (seconds) of one Trainer call."""

    def __init__(self) -> None:
        self.epochs: list[float] = []
        self.steps: list[float] = []
        self._t = self._s = 0.0

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._t = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.epochs.append(time.perf_counter() - self._t)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._s = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps.append(time.perf_counter() - self._s)


def _data(n_batches: int, bs: int, dim: int, classes: int, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(bs, dim, generator=g), torch.randint(0, classes, (bs,), generator=g))
            for _ in range(n_batches)]


def _model(net: nn.Module, strategy: str):
    from lit_amp import Model

    return Model(net, nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), 1e-3),
                 trainer={**CPU2, "strategy": strategy})


def _sink(args: argparse.Namespace) -> dict:
    """(a): samples per second, sink vs non-sink, same network and data."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    model = _model(net, "ddp")
    steps, bs = args.sink_steps, args.batch
    data = _data(2 * steps, bs, 64, 10)  # 2 ranks x steps batches: one epoch
    runs = {"non_sink": {"dataset_sink_mode": False},
            "sink": {"dataset_sink_mode": True, "sink_size": steps}}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(args.repeats + 1):  # round 0 warms up
        names = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for name in names:
            clock = Clock()
            model.train(1, data, callbacks=[clock], **runs[name])
            if r:
                times[name].append(clock.epochs[0])
    samples = 2 * steps * bs
    out = {k: {"median_s": statistics.median(v), "samples_per_s": samples / statistics.median(v),
               "runs_s": v} for k, v in times.items()}
    out["sink_speedup"] = out["non_sink"]["median_s"] / out["sink"]["median_s"]
    out["setup"] = {"steps_per_rank": steps, "batch": bs,
                    "params": sum(p.numel() for p in net.parameters())}
    return out


def _local_bytes(t: torch.Tensor) -> int:
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def _fsdp_vs_ddp(args: argparse.Namespace) -> dict:
    """(b): step time and per-rank parameter / optimizer-state bytes."""
    out: dict = {}
    data = _data(2 * args.steps, args.batch, 512, 512, seed=1)
    models = {}
    for strategy in ("ddp", "fsdp2"):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                            nn.Linear(2048, 512))
        models[strategy] = (net, _model(net, strategy))
    steps: dict[str, list[float]] = {k: [] for k in models}
    for r in range(args.repeats):
        for strategy in (("ddp", "fsdp2") if r % 2 == 0 else ("fsdp2", "ddp")):
            clock = Clock()
            models[strategy][1].train(r + 1, data, callbacks=[clock], initial_epoch=r)
            steps[strategy].extend(clock.steps[2:])  # the first steps allocate
    for strategy, (net, model) in models.items():
        opt = model.lit_model.optimizer
        state = [v for s in opt.state.values() for v in s.values()
                 if torch.is_tensor(v) and v.dim() > 0]
        out[strategy] = {
            "median_step_ms": 1e3 * statistics.median(steps[strategy]),
            "steps_timed": len(steps[strategy]),
            "param_bytes_per_rank": sum(_local_bytes(p) for p in net.parameters()),
            "optimizer_state_bytes_per_rank": sum(_local_bytes(v) for v in state),
            "params": sum(p.numel() for p in net.parameters()),
        }
    out["param_bytes_ratio_fsdp2_to_ddp"] = (out["fsdp2"]["param_bytes_per_rank"]
                                             / out["ddp"]["param_bytes_per_rank"])
    out["step_time_ratio_fsdp2_to_ddp"] = (out["fsdp2"]["median_step_ms"]
                                           / out["ddp"]["median_step_ms"])
    out["setup"] = {"steps_per_rank_per_call": args.steps, "batch": args.batch,
                    "optimizer": "Adam"}
    return out


def main() -> None:
    args = parser(__doc__, doc_option=False, repeats=3, sink_steps=200, steps=20,
                  batch=32).parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    res = {"sink": _sink(args), "fsdp2_vs_ddp": _fsdp_vs_ddp(args)}
    res["load_avg_before"], res["load_avg_after"] = load_before, os.getloadavg()
    res["command"] = "OMP_NUM_THREADS=1 .venv/bin/python bench/data_parallel.py"
    res["args"] = vars(args)
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(write_result("data_parallel", res))
    if dist.is_initialized():
        dist.barrier()


if __name__ == "__main__":
    main()
