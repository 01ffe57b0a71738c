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

import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import _boost  # noqa: E402
from bench._boost import (  # noqa: E402
    BLOCKS,
    DDP,
    EPOCHS,
    LR,
    MOMENTUM,
    SINGLE,
    TARGETS,
    WD,
    _data,
    _quiet,
    _run,
    target_values,
)
from bench._common import RESULTS, check_targets, free_port, machine, parser, splice, write_result  # noqa: E402


def _order(names: list[str], seed_index: int) -> list[str]:
    k = seed_index % max(1, len(names))
    return names[k:] + names[:k]


def _ddp_worker(
    rank: int, world: int, port: int, seeds: list[int], epochs: int, out: str, width: int,
    batch: int = _boost.BATCH,
) -> None:
    _boost.WIDTH, _boost.BATCH = width, batch
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
    ap = parser(__doc__)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--width", type=int, default=_boost.WIDTH, help="channels (smoke tests: 8)")
    ap.add_argument("--no-ddp", action="store_true")
    ap.add_argument("--batch", type=int, default=_boost.BATCH,
                    help="global batch (DDP: split over the 2 processes); a non-default batch "
                    "is a labelled run in results/boost.json's history and leaves the docs alone")
    ap.add_argument("--ddp-only", action="store_true", help="skip the single-process phase")
    args = ap.parse_args()
    if args.seeds < 3:
        ap.error("--seeds must be >= 3")
    _quiet()
    torch.set_num_threads(1)
    _boost.WIDTH, _boost.BATCH = width, batch = args.width, args.batch
    seeds = list(range(args.seeds))
    load_before = os.getloadavg()[0]
    t_start = time.perf_counter()
    data = _data()
    single: dict[str, list] = {k: [] for k in SINGLE}
    names = [] if args.ddp_only else list(SINGLE)
    if args.ddp_only:
        single = {}
    print(f"single process: {names}, seeds {seeds}, {args.epochs} epochs, batch {batch}")
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
        out = RESULTS / ".boost_ddp.pt"
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"DDP, 2 processes: {list(DDP)}")
        mp.spawn(
            _ddp_worker,
            args=(2, free_port(), seeds, args.epochs, str(out), width, batch),
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
        f"ResNet1D(width {width}, blocks {BLOCKS}, BatchNorm) on MNIST-1D, batch {batch}, "
        f"SGD m={MOMENTUM} wd={WD} cosine lr {LR}, {args.epochs} epochs, CPU fp32, 1 thread "
        "per process"
    )
    default = batch == 100 and not args.ddp_only
    path = write_result(
        "boost",
        {
            "task": task,
            "seeds": seeds,
            "epochs": args.epochs,
            "targets": {t.name: f"{t.op} {t.goal:g}" for t in TARGETS},
            "targets_met": check_targets(TARGETS, target_values(s_sum, d_sum)),
            "single_process": s_sum,
            "ddp_2_processes": d_sum,
            "ddp_vs_single_process_O0": cross,
            "runs": {"single": single, "ddp": ddp},
            "load_average_1min": {"before": load_before, "after": load_after},
            "elapsed_seconds": elapsed,
        },
        variant=None if default else f"batch {batch}" + (" ddp only" if args.ddp_only else ""),
    )
    print(
        f"\nwritten: {path}  ({elapsed:.0f} s; load average {load_before:.1f} -> {load_after:.1f})"
    )
    if not args.no_doc and default:
        _write_doc(task, s_sum, d_sum, cross, seeds, load_before, load_after)


def _write_doc(task, s_sum, d_sum, cross, seeds, load_before, load_after) -> None:
    m = machine()
    lines = [
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
        "with <= 3 pt loss.",
    ]
    splice("boost", "\n".join(lines))


if __name__ == "__main__":
    main()
