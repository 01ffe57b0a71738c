"""What reading a chain of row-increment checkpoints costs a resume, at 26 M rows.

``python -m bench.online``'s scale model (5.3 GB of weights and LazyAdam state) is checkpointed
whole through :class:`~lit_amp.rec.state.snapshot.Snapshots`, then ``--increments`` times after a
LazyAdam step that changes ``--fraction`` of the table's rows (random rows, a real sparse
gradient), each a row increment of the previous file. Then, ``--repeats`` times each, the
time :func:`~lit_amp.serialization.load_checkpoint` takes to read the whole file and the
end of chains of several lengths, with the page cache dropped before each read when this
process may (root), as a restarted machine reads them; each result is checked against the
state of its step. Writes ``bench/results/increment_resume.json``.

    .venv/bin/python -m bench.online.increment_resume [--vocab 1000000] [--increments 9]
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
import zlib
from pathlib import Path

import torch

from bench._common import parser, write_result
from bench.online import workload
from lit_amp.rec.state.snapshot import Snapshots
from lit_amp.serialization import load_checkpoint


def drop_caches() -> bool:
    """Drop the page cache (root only); whether it was dropped."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def crc(state: dict) -> int:
    """A CRC32 over the table and its two moments (what increments carry)."""
    out = 0
    for t in state_tensors(state):
        out = zlib.crc32(t.contiguous().view(torch.uint8).numpy(), out)
    return out


def state_tensors(state: dict) -> list[torch.Tensor]:
    sd, opt = state["state_dict"], state["optimizer_states"][0]["state"]
    key = next(k for k in sd if k.endswith("embedding.weight"))
    return [sd[key], *(v for v in opt[0].values() if torch.is_tensor(v) and v.dim() == 2)]


def touch(net: torch.nn.Module, opt: torch.optim.Optimizer, fraction: float) -> None:
    """One LazyAdam step whose sparse gradient names ``fraction`` of the table's rows."""
    table = net.embedding.weight
    rows = torch.randperm(table.shape[0])[: int(fraction * table.shape[0])].sort().values
    opt.zero_grad(set_to_none=True)
    table.grad = torch.sparse_coo_tensor(rows[None], torch.randn(len(rows), table.shape[1]) * 1e-3,
                                         table.shape)
    opt.step()


def main() -> None:
    args = parser(__doc__, doc_option=False, vocab=1_000_000, increments=9, fraction=0.4,
                  repeats=2).parse_args()
    torch.set_num_threads(1)
    net, opt = workload.scale_model(args.vocab, "lazyadam", False)
    touch(net, opt, args.fraction)  # the moments exist
    for p in net.parameters():
        p.grad = None
    snaps = Snapshots([opt], track_rows=True)
    root = Path(tempfile.mkdtemp(prefix="lit_amp_bench_increments_"))
    files, sums, prev = [], [], None
    try:
        for k in range(args.increments + 1):
            if k:
                touch(net, opt, args.fraction)
            payload = {"state_dict": net.state_dict(), "optimizer_states": [opt.state_dict()]}
            snap = snaps.take(payload, prev=prev)
            assert snap.increment == bool(k)
            path = root / f"{k}.ckpt"
            stats = snap.write(path)
            sums.append(crc(payload))
            files.append({"file": path.name, "bytes": stats.bytes, "write_s": stats.write_s})
            prev = path.name
            print(f"wrote {path.name}: {stats.bytes / 1e9:.2f} GB in {stats.write_s:.1f} s",
                  flush=True)
        snaps.remove()
        del net, opt
        lengths = sorted({0, 1, args.increments // 3, args.increments})
        reads: dict[int, list[float]] = {n: [] for n in lengths}
        dropped = True
        for _ in range(args.repeats):
            for n in lengths:
                dropped = drop_caches() and dropped
                t0 = time.perf_counter()
                state = load_checkpoint(str(root / f"{n}.ckpt"))
                state_tensors(state)[0].sum()  # every page of the table read
                reads[n].append(time.perf_counter() - t0)
                assert crc(state) == sums[n], f"the chain of {n} increments read wrong"
                del state
                print(f"read {n} increment(s): {reads[n][-1]:.1f} s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "vocab": args.vocab, "rows": 26 * args.vocab, "fraction": args.fraction,
        "page_cache_dropped": dropped, "files": files,
        "read_s_median": {str(n): statistics.median(v) for n, v in reads.items()},
        "read_s": {str(n): v for n, v in reads.items()},
    }
    print(f"written: {write_result('increment_resume', result)}")


if __name__ == "__main__":
    main()
