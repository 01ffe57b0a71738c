"""Benchmark: what one all-gather costs between 2 CPU processes, gloo vs shared memory (#6).

Why AdaSum's exchange goes through :class:`lit_amp.boost.adasum.shm.ShmAllGather` on one host: each
rank computes for ``--work-ms`` (a matmul loop; one rank 1 ms longer on alternate steps, so the
arrival skew is known: 0.5 ms on average), then all-gathers a vector of ``--numel`` floats
(43k = the boost benchmark's ResNet1D). Reported per step, median of ``--rounds`` rounds with
the transports interleaved: wall ms, CPU ms of the rank, and ms spent in the collective. The
rows gathered are checked against the expected values on every call.

    .venv/bin/python bench/collectives.py             # ~40 s
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import RESULTS, compute_for, free_port, parser, write_result  # noqa: E402


def _worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    from lit_amp.boost.adasum.shm import ShmAllGather

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    n = args.numel
    ch = ShmAllGather(n)
    rows = torch.empty(2, n)
    res: dict[str, list] = {"none": [], "gloo": [], "shm": []}
    calls = 0
    for _ in range(args.rounds):
        for mode in res:
            dist.barrier()
            t, c, comm = time.perf_counter(), time.process_time(), 0.0
            for i in range(args.steps):
                compute_for(args.work_ms + (1.0 if i % 2 == rank else 0.0))
                x = torch.full((n,), float(10 * calls + rank))
                t0 = time.perf_counter()
                if mode == "gloo":
                    dist.all_gather(list(rows.unbind(0)), x)
                    got = rows
                elif mode == "shm":
                    got = ch.all_gather(x)
                comm += time.perf_counter() - t0
                if mode != "none":
                    assert float(got[1 - rank, 0]) == 10 * calls + 1 - rank, "wrong row"
                calls += 1
            s = args.steps
            res[mode].append(
                ((time.perf_counter() - t) / s * 1e3, (time.process_time() - c) / s * 1e3,
                 comm / s * 1e3)
            )
    if rank == 0:
        torch.save(res, out)
    dist.barrier()
    ch.close()
    dist.destroy_process_group()


def main() -> None:
    args = parser(__doc__, doc_option=False, numel=43_000, work_ms=8.0, steps=100,
                  rounds=5).parse_args()
    port = free_port()
    out = str(RESULTS / ".collectives.pt")
    mp.spawn(_worker, args=(port, args, out), nprocs=2, join=True)
    res = torch.load(out)
    os.unlink(out)
    summary = {
        mode: {
            k: statistics.median(r[i] for r in runs)
            for i, k in enumerate(("step_ms", "cpu_ms", "collective_ms"))
        }
        for mode, runs in res.items()
    }
    print(f"all-gather of {args.numel} floats between 2 processes after {args.work_ms} ms work")
    print("| exchange | step (ms) | CPU (ms) | in the collective (ms) |\n|---|---:|---:|---:|")
    for mode, r in summary.items():
        print(f"| {mode} | {r['step_ms']:.2f} | {r['cpu_ms']:.2f} | {r['collective_ms']:.2f} |")
    path = write_result(
        "collectives",
        {"args": vars(args), "summary": summary, "rounds": {k: v for k, v in res.items()}},
    )
    print(f"written: {path}")


if __name__ == "__main__":
    main()
