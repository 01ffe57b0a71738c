"""Benchmark: AdaSum's exchange, bytes sent per rank and time, all-gather vs vector halving (#17).

For 2 and 4 CPU processes (gloo, one host, one thread each) and a delta of ``--numel`` floats
split into MLP-like tensors, every rank computes for ``--work-ms`` (a matmul loop standing in
for forward/backward/step) and then runs one AdaSum exchange, with the variants interleaved
round by round:

- ``allgather``: the former exchange, ``torch.distributed.all_gather`` of every rank's whole
  delta (``allgather_exchange``);
- ``halving``: the recursive vector-halving exchange (``transport="process_group"`` from 3
  ranks on; with 2 ranks AdaSum uses ``allgather``, which sends the same N floats per rank in
  one collective);
- ``shm``: the all-gather through shared memory (``transport="shm"``).

Bytes sent per rank per exchange come from ``lit_amp.boost.adasum.transport.TRAFFIC``
(point-to-point sends counted exactly; all-gathers as the ring algorithm's ``(world - 1) x chunk``).
Step time is the median wall ms per step (compute + exchange) of rank 0 over ``--rounds`` rounds of
``--steps`` steps; the results of the three variants are also checked against each other.

    .venv/bin/python bench/adasum_bytes.py            # ~4 min
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
from bench._common import compute_for, free_port, parser, write_result  # noqa: E402


def _shapes(numel: int) -> list[tuple[int, ...]]:
    """MLP-like tensors (weights, biases, one scalar) totalling about ``numel`` floats."""
    h = max(4, int((numel / 3) ** 0.5))
    return [(h, h), (h,), (h, h), (h,), (h, h), (h,), (1,)]



def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    from lit_amp.boost.adasum import transport as mod
    from lit_amp.boost.adasum.maths import EPS, SegmentLayout
    from lit_amp.boost.adasum.shm import ShmAllGather

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    g = torch.Generator().manual_seed(rank)
    shapes = _shapes(args.numel)
    delta = torch.cat([torch.randn(s, generator=g).reshape(-1) for s in shapes])
    layout = SegmentLayout([torch.Size(s) for s in shapes], delta.device)
    channel = ShmAllGather(delta.numel())
    variants = {
        "allgather": lambda: mod.allgather_exchange(delta, layout, None, 1),
        "halving": lambda: (mod.VectorHalving(layout, None, 1, EPS).run(delta), None),
        "shm": lambda: mod.exchange(delta, layout, None, 1, channel=channel),
    }
    res = {k: f()[0] for k, f in variants.items()}  # warm-up and agreement check
    for k in ("halving", "shm"):
        torch.testing.assert_close(res[k], res["allgather"], rtol=1e-5, atol=1e-6)
    sent = {}
    for k, f in variants.items():
        mod.TRAFFIC["bytes_sent"] = 0
        f()
        sent[k] = mod.TRAFFIC["bytes_sent"]
    times: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(args.rounds):
        for k in names[r % 3 :] + names[: r % 3]:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                compute_for(n=64, ms=args.work_ms)
                variants[k]()
            times[k].append((time.perf_counter() - t0) * 1e3 / args.steps)
    channel.close()
    if rank == 0:
        torch.save({"sent": sent, "times": times, "numel": delta.numel()}, out)
    dist.barrier()
    dist.destroy_process_group()


def _run(world: int, numel: int, args: argparse.Namespace, tmp: str) -> dict:
    out = os.path.join(tmp, f"w{world}_{numel}.pt")
    args = argparse.Namespace(**{**vars(args), "numel": numel})
    mp.spawn(_worker, args=(world, free_port(), args, out), nprocs=world, join=True)
    r = torch.load(out)
    n = r["numel"]
    return {
        "world": world,
        "numel": n,
        "bytes_sent_per_rank": r["sent"],
        "bytes_per_float_of_delta": {k: round(v / (4 * n), 3) for k, v in r["sent"].items()},
        "step_ms_median": {k: round(statistics.median(v), 3) for k, v in r["times"].items()},
        "step_ms_rounds": {k: [round(x, 3) for x in v] for k, v in r["times"].items()},
    }


def main() -> None:
    p = parser(__doc__, doc_option=False)
    p.add_argument("--numel", type=int, nargs="+", default=[43_000, 300_000])
    p.add_argument("--work-ms", type=float, default=10.0)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    args = p.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rows = [_run(w, n, args, tmp) for n in args.numel for w in args.worlds]
    for row in rows:
        print(row["world"], row["numel"], row["bytes_per_float_of_delta"], row["step_ms_median"])
    path = write_result(
        "adasum_bytes",
        {
            "command": "python bench/adasum_bytes.py " + " ".join(sys.argv[1:]),
            "params": vars(args),
            "rows": rows,
        },
    )
    print("wrote", path)


if __name__ == "__main__":
    main()
