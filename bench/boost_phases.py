"""Where a DDP training step's time goes, per rank: plain DDP vs boost O2 (issue #6).

Runs ``bench/boost.py``'s DDP variants (same model, data and trainer) in 2 gloo processes with
wall-clock timers wrapped around the step's phases: forward (``LitModel.loss_of``), backward,
optimizer step (of which AdaSum's snapshot, post-step work and exchange), Lightning's per-step
SIGTERM broadcast, and the whole ``advance`` of Lightning's epoch loop. Milliseconds per step,
median over ``--reps`` interleaved repetitions. The timers add a few microseconds per call.

    .venv/bin/python bench/boost_phases.py                      # DDP O0 vs DDP O2, ~2 min
    .venv/bin/python bench/boost_phases.py --variants "DDP O0" "DDP O2, gloo exchange"
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import _boost as B  # noqa: E402
from bench._common import RESULTS, free_port, parser, write_result  # noqa: E402

TIMES: dict[str, float] = collections.defaultdict(float)


def _wrap(owner: Any, name: str, key: str) -> None:
    f = getattr(owner, name)

    def timed(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            TIMES[key] += time.perf_counter() - t

    setattr(owner, name, timed)


def _instrument() -> None:
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    import lit_amp.boost.adasum.hooks as A
    from lit_amp.model.lit_model import LitModel

    _wrap(LitModel, "loss_of", "forward")
    _wrap(LitModel, "train_backward", "backward")
    _wrap(LitModel, "train_optimizer_step", "optimizer step")
    _wrap(A.AdaSumHooks, "_pre", "  AdaSum snapshot")
    _wrap(A.AdaSumHooks, "_post", "  AdaSum after the step")
    _wrap(A, "exchange", "    AdaSum exchange")
    _wrap(LitModel, "training_step", "training_step")
    _wrap(_TrainingEpochLoop, "_broadcast_sigterm_tensor", "Lightning SIGTERM broadcast")
    _wrap(_TrainingEpochLoop, "advance", "whole step")


def _worker(rank: int, port: int, variants: list[str], epochs: int, reps: int, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
        LOCAL_RANK=str(rank), NODE_RANK="0",
    )
    torch.set_num_threads(1)
    B._quiet()
    dist.init_process_group("gloo", rank=rank, world_size=2)
    _instrument()
    data = B._data()
    steps = epochs * (len(data["x"]) // B.BATCH)
    res: dict[str, list] = {v: [] for v in variants}
    for _ in range(reps):
        for name in variants:
            dist.barrier()
            TIMES.clear()
            r = B._run(B.DDP[name], 0, epochs, data, ddp_world=2)
            row = {k: v / steps * 1e3 for k, v in TIMES.items()}
            row["samples/s"] = r["samples_per_s"]
            res[name].append(row)
    torch.save(res, f"{out}.{rank}")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = parser(__doc__, doc_option=False)
    ap.add_argument("--variants", nargs="+", default=["DDP O0", "DDP O2"], choices=list(B.DDP))
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    port = free_port()
    out = str(RESULTS / ".boost_phases")
    mp.spawn(_worker, args=(port, args.variants, args.epochs, args.reps, out), nprocs=2)
    ranks = []
    for r in range(2):
        ranks.append(torch.load(f"{out}.{r}"))
        os.unlink(f"{out}.{r}")
    summary: dict[str, dict] = {}
    for name in args.variants:
        keys = sorted({k for rank in ranks for row in rank[name] for k in row})
        summary[name] = {
            f"rank {r}": {
                k: statistics.median(row.get(k, 0.0) for row in ranks[r][name]) for k in keys
            }
            for r in range(2)
        }
    for name, per_rank in summary.items():
        print(f"\n{name}: ms per step (median of {args.reps})")
        for r, row in per_rank.items():
            print(f"  {r}: " + ", ".join(f"{k.strip()} {v:.2f}" for k, v in row.items()))
    path = write_result("boost_phases", {"args": vars(args), "summary": summary})
    print(f"written: {path}")


if __name__ == "__main__":
    main()
