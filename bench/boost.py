"""Benchmark: boost levels O0 / O1 / O2 and each algorithm's contribution (issue #6).

A residual 1-D CNN with BatchNorm (``lit_amp.demos.ResNet1D``: width 32, 3 stages of 2
basic blocks, 15 BatchNorm layers) on MNIST-1D, SGD momentum 0.9, cosine LR, batch 100 (DDP:
2 x 50), fp32, CPU, ``LitModel`` in a Lightning ``Trainer`` with ``AutoBoost`` as a callback.

Two phases, each interleaving its variants (rotating order per seed) over >= 3 seeds:

- single process (1 intra-op thread): O0, O1, and the ablations LessBN only, LessBN without
  the FN head and gradient centralization (BN removal only), GradientFreeze only;
- 2 DDP processes (gloo, 1 thread each, launched once; one Lightning ``Trainer`` per run):
  plain DDP (O0), O2 (LessBN + GradientFreeze + AdaSum), O1 under DDP, AdaSum only.

Throughput is training samples/s from the second epoch to the end of fit (epoch 1 is warm-up;
set-up and evaluation excluded), both per wall-clock second and per CPU second of the
process(es) (``time.process_time``; robust to other jobs on the shared cores). Ratios are taken
per seed against the same seed's baseline of the same phase (O0, or plain DDP), then the
median is reported. Final test accuracy is measured on the 1000 test samples after training.

    .venv/bin/python bench/boost.py                 # 3 seeds, 8 epochs (6-11 minutes here)
    .venv/bin/python bench/boost.py --seeds 5 --epochs 10
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DOC, free_port, machine, write_result  # noqa: E402

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
TARGETS = {
    "O1": {"speedup": 1.20, "acc_drop_pts": 0.5},
    "O2": {"speedup": 1.30, "acc_drop_pts": 3.0},
}


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
    trainer = L.Trainer(
        max_epochs=epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kw,
    )
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


def _order(names: list[str], seed_index: int) -> list[str]:
    k = seed_index % max(1, len(names))
    return names[k:] + names[:k]


def _ddp_worker(
    rank: int, world: int, port: int, seeds: list[int], epochs: int, out: str, width: int,
    batch: int = BATCH,
) -> None:
    global WIDTH, BATCH
    WIDTH, BATCH = width, batch
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
    )
    torch.set_num_threads(1)
    _quiet()
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world)
    data = _data()
    results: dict[str, list] = {k: [] for k in DDP}
    names = list(DDP)
    for i, seed in enumerate(seeds):
        for name in _order(names, i):
            dist.barrier()
            r = _run(DDP[name], seed, epochs, data, ddp_world=world)
            cpu = torch.tensor([r["cpu_seconds"]])
            dist.all_reduce(cpu)  # CPU seconds of all ranks
            r["cpu_seconds_all_ranks"] = float(cpu)
            r["seed"] = seed
            results[name].append(r)
            if rank == 0:
                print(
                    f"  [ddp] seed {seed} {name:16s} {r['samples_per_s']:8.0f} samples/s "
                    f"acc {r['acc']:.3f}",
                    flush=True,
                )
    if rank == 0:
        torch.save(results, out)
    dist.barrier()  # neither rank tears gloo down while the other still talks (SIGABRT seen)
    dist.destroy_process_group()


def _summary(results: dict[str, list], base: str, cpu_key: str) -> dict[str, dict]:
    out = {}
    for name, runs in results.items():
        b = results[base]
        wall = [r["samples_per_s"] / q["samples_per_s"] for r, q in zip(runs, b)]
        cpu = [q[cpu_key] / r[cpu_key] for r, q in zip(runs, b)]
        acc = [100 * (r["acc"] - q["acc"]) for r, q in zip(runs, b)]
        row = {
            "samples_per_s_median": statistics.median(r["samples_per_s"] for r in runs),
            "speedup_wall_median": statistics.median(wall),
            "speedup_wall_per_seed": wall,
            "speedup_cpu_median": statistics.median(cpu),
            "speedup_cpu_per_seed": cpu,
            "acc_median": statistics.median(r["acc"] for r in runs),
            "acc_per_seed": [r["acc"] for r in runs],
            "acc_delta_pts_median": statistics.median(acc),
            "acc_delta_pts_mean": statistics.fmean(acc),
        }
        for key in (
            "frozen_step_fraction",
            "mean_frozen_param_fraction",
            "train_sets",
            "bn_layers",
            "bn_layers_before",
            "adasum_transport",
        ):
            if key in runs[0]:
                row[key] = runs[0][key]
        out[name] = row
    return out


def _table(summary: dict[str, dict], base: str) -> list[str]:
    lines = [
        f"| variant | samples/s (median) | speedup vs {base}, wall | speedup, CPU time "
        "| test acc (median) | Δ acc vs base (pts, mean) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in summary.items():
        lines.append(
            f"| {name} | {r['samples_per_s_median']:.0f} | {r['speedup_wall_median']:.3f} "
            f"| {r['speedup_cpu_median']:.3f} | {100 * r['acc_median']:.1f} % "
            f"| {r['acc_delta_pts_mean']:+.2f} |"
        )
    return lines


def main() -> None:
    global WIDTH, BATCH
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--width", type=int, default=WIDTH, help="channels (smoke tests: 8)")
    ap.add_argument("--no-ddp", action="store_true")
    ap.add_argument("--no-doc", action="store_true", help="do not update docs/benchmarks.md")
    ap.add_argument("--batch", type=int, default=BATCH,
                    help="global batch (DDP: split over the 2 processes); a non-default batch "
                    "writes results/boost_batch<B>.json and leaves the docs alone")
    ap.add_argument("--ddp-only", action="store_true", help="skip the single-process phase")
    args = ap.parse_args()
    if args.seeds < 3:
        ap.error("--seeds must be >= 3")
    _quiet()
    torch.set_num_threads(1)
    WIDTH, BATCH = args.width, args.batch
    seeds = list(range(args.seeds))
    load_before = os.getloadavg()[0]
    t_start = time.perf_counter()
    data = _data()
    single: dict[str, list] = {k: [] for k in SINGLE}
    names = [] if args.ddp_only else list(SINGLE)
    if args.ddp_only:
        single = {}
    print(f"single process: {names}, seeds {seeds}, {args.epochs} epochs, batch {BATCH}")
    for i, seed in enumerate(seeds):
        for name in _order(names, i):
            r = _run(SINGLE[name], seed, args.epochs, data)
            r["seed"] = seed
            single[name].append(r)
            print(
                f"  seed {seed} {name:24s} {r['samples_per_s']:8.0f} samples/s acc {r['acc']:.3f}",
                flush=True,
            )
    ddp: dict[str, list] = {}
    if not args.no_ddp:
        out = Path(__file__).resolve().parent / "results" / ".boost_ddp.pt"
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"DDP, 2 processes: {list(DDP)}")
        mp.spawn(
            _ddp_worker,
            args=(2, free_port(), seeds, args.epochs, str(out), WIDTH, BATCH),
            nprocs=2,
            join=True,
        )
        ddp = torch.load(out)
        out.unlink()
    elapsed = time.perf_counter() - t_start
    load_after = os.getloadavg()[0]
    s_sum = _summary(single, "O0", "cpu_seconds") if single else {}
    d_sum = _summary(ddp, "DDP O0", "cpu_seconds_all_ranks") if ddp else {}
    # cross-phase (different processes, not interleaved): DDP variants vs single-process O0
    cross = {}
    if ddp and single:
        for name, runs in ddp.items():
            cross[name] = {
                "samples_per_s_vs_single_O0_wall": statistics.median(
                    r["samples_per_s"] / q["samples_per_s"] for r, q in zip(runs, single["O0"])
                ),
                "samples_per_cpu_s_vs_single_O0": statistics.median(
                    q["cpu_seconds"] / r["cpu_seconds_all_ranks"]
                    for r, q in zip(runs, single["O0"])
                ),
                "acc_delta_pts_vs_single_O0_mean": statistics.fmean(
                    100 * (r["acc"] - q["acc"]) for r, q in zip(runs, single["O0"])
                ),
            }
    print()
    if s_sum:
        print("\n".join(_table(s_sum, "O0")))
    if d_sum:
        print()
        print("\n".join(_table(d_sum, "DDP O0")))
    task = (
        f"ResNet1D(width {WIDTH}, blocks {BLOCKS}, BatchNorm) on MNIST-1D, batch {BATCH}, "
        f"SGD m={MOMENTUM} wd={WD} cosine lr {LR}, {args.epochs} epochs, CPU fp32, 1 thread "
        "per process"
    )
    default = BATCH == 100 and not args.ddp_only
    path = write_result(
        "boost" if default else f"boost_batch{BATCH}",
        {
            "task": task,
            "seeds": seeds,
            "epochs": args.epochs,
            "targets": TARGETS,
            "single_process": s_sum,
            "ddp_2_processes": d_sum,
            "ddp_vs_single_process_O0": cross,
            "runs": {"single": single, "ddp": ddp},
            "load_average_1min": {"before": load_before, "after": load_after},
            "elapsed_seconds": elapsed,
        },
    )
    print(
        f"\nwritten: {path}  ({elapsed:.0f} s; load average {load_before:.1f} -> {load_after:.1f})"
    )
    if not args.no_doc and default:
        _write_doc(task, s_sum, d_sum, cross, seeds, load_before, load_after)


def _write_doc(task, s_sum, d_sum, cross, seeds, load_before, load_after) -> None:
    m = machine()
    lines = [
        "<!-- bench:boost:start -->",
        "## Boost levels (`bench/boost.py`, issue #6)",
        "",
        f"{task}. Seeds {seeds}; variants interleaved per seed; samples/s from epoch 2 to the "
        "end (set-up, warm-up epoch and evaluation excluded). Speedups are per-seed ratios to "
        "the same phase's baseline, median over seeds: *wall* = samples per wall second, "
        "*CPU time* = samples per CPU second of the process(es), which other jobs on the shared "
        "cores disturb much less. Command: `.venv/bin/python bench/boost.py`.",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}; "
        f"{time.strftime('%Y-%m-%d')}; load average (1 min) {load_before:.1f} before / "
        f"{load_after:.1f} after (shared machine).",
        "",
        "Single process (baseline O0):",
        "",
        *_table(s_sum, "O0"),
    ]
    if d_sum:
        lines += ["", "Two DDP processes, gloo (baseline plain DDP):", "", *_table(d_sum, "DDP O0")]
        o2 = cross.get("DDP O2", {})
        nan = float("nan")
        wall = o2.get("samples_per_s_vs_single_O0_wall", nan)
        cpu = o2.get("samples_per_cpu_s_vs_single_O0", nan)
        dacc = o2.get("acc_delta_pts_vs_single_O0_mean", nan)
        lines += [
            "",
            "DDP O2 against single-process O0 (different phases, not interleaved): "
            f"{wall:.2f}x samples per wall second (2 processes vs 1), {cpu:.2f}x samples per "
            f"CPU second, {dacc:+.2f} pts accuracy.",
        ]
    lines += [
        "",
        "Targets (issue #6): O1 >= 1.20x O0 with accuracy within 0.5 pt; O2 >= 1.30x "
        "with <= 3 pt loss. See the analysis below the tables.",
        "",
        "BOOST_ANALYSIS",
        "<!-- bench:boost:end -->",
    ]
    section = "\n".join(lines) + "\n"
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    start, end = "<!-- bench:boost:start -->", "<!-- bench:boost:end -->"
    if start in text and end in text:
        pre, rest = text.split(start, 1)
        _, post = rest.split(end, 1)
        old = rest.split(end, 1)[0]
        if "BOOST_ANALYSIS" not in old and "### Analysis" in old:  # keep a written analysis
            section = section.replace("BOOST_ANALYSIS", old[old.index("### Analysis") :].strip())
        text = pre + section + post.lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    DOC.write_text(text)
    print(f"updated: {DOC}")


if __name__ == "__main__":
    main()
