"""Benchmark: collision-free ids and delta publishing against the hashed table they extend.

Wide&Deep (26 categorical features, embedding width 16, sparse gradients, LazyAdam), batch
1000, on SyntheticClickSource's Zipf ids (10^6 distinct ids per feature, so a run keeps
meeting new ids). Per table size (rows per feature), interleaved, warm-up excluded:

- ``hashed``: ``id % vocab_size`` rows (the default);
- ``collisionless``: one row per distinct id (IdEmbedding), evicting when the budget is full;
- ``hashed + row tracking``: the hashed step with a DeltaPublisher's TouchedRows hooked
  into the optimizer (the cost delta publishing adds to every step).

Every table page is written once before timing (first touches of fresh memory are not a
variant's cost). Then one publish of each kind after the timed steps: a full snapshot, and a
delta of the rows the steps of one 2-second interval touched (bytes and seconds).

    .venv/bin/python bench/rec_tables.py [--sizes 10000 100000] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import measure, parser, write_result  # noqa: E402
from lit_amp.rec import LazyAdam, WideDeep  # noqa: E402
from lit_amp.rec.serving.writer import DeltaPublisher  # noqa: E402
from lit_amp.rec.sources import SyntheticClickSource  # noqa: E402

BATCH = 1000
STEPS = 20  # steps per timed round


def _batches(n: int) -> list:
    src = iter(SyntheticClickSource(batch_size=BATCH, vocab_size=1_000_000, seed=3))
    return [next(src) for _ in range(n)]


class Run:
    """One variant: a network, its optimizer and a cursor into the shared batches."""

    def __init__(self, vocab: int, batches: list, *, collisionless: bool = False,
                 track: bool = False) -> None:
        torch.manual_seed(0)
        self.net = WideDeep(vocab_size=vocab, embed_dim=16, sparse=True,
                            collisionless=collisionless)
        self.opt = LazyAdam(self.net.parameters(), lr=1e-3)
        self.loss = torch.nn.BCEWithLogitsLoss()
        self.batches, self.i = batches, 0
        self.steps(1)  # the optimizer state exists; now fault in every page of the tables,
        with torch.no_grad():  # so that first touches are not timed as the variant's cost
            for t in [*self.net.parameters(), *self.net.buffers(),
                      *(v for s in self.opt.state.values() for v in s.values()
                        if torch.is_tensor(v))]:
                t.add_(0) if t.is_floating_point() else t.copy_(t.clone())
        self.publisher = None
        if track:
            self.publisher = DeltaPublisher(self.net, tempfile.mkdtemp(prefix="rec_tables-"))
            self.publisher.attach(self.opt)

    def steps(self, n: int = STEPS) -> None:
        for _ in range(n):
            features, label = self.batches[self.i % len(self.batches)]
            self.i += 1
            self.opt.zero_grad(set_to_none=True)
            self.loss(self.net(features), label).backward()
            self.opt.step()


def _publishes(run: Run, step_s: float) -> dict:
    """A full snapshot, then a delta after one 2-second interval of steps."""
    pub = run.publisher
    t0 = time.perf_counter()
    pub.publish(step=run.i)
    full_s, full_bytes = time.perf_counter() - t0, pub.last_bytes
    run.steps(max(1, round(2.0 / step_s)))
    t0 = time.perf_counter()
    pub.publish(step=run.i)
    return {"full_bytes": full_bytes, "full_s": round(full_s, 3),
            "delta_bytes": pub.last_bytes, "delta_s": round(time.perf_counter() - t0, 3),
            "delta_rows": pub.last_rows, "delta_kind": pub.last_kind,
            "delta_fraction": round(pub.last_bytes / full_bytes, 4)}


def bench_size(vocab: int, batches: list, repeats: int) -> dict:
    runs = {
        "hashed": Run(vocab, batches),
        "collisionless": Run(vocab, batches, collisionless=True),
        "hashed + row tracking": Run(vocab, batches, track=True),
    }
    times = measure({n: r.steps for n, r in runs.items()}, repeats, warmup=1).rounds
    step_s = {n: statistics.median(t) / STEPS for n, t in times.items()}
    emb = runs["collisionless"].net.embedding
    out = {
        "vocab_per_feature": vocab,
        "rows": 26 * vocab,
        "records_per_s": {n: round(BATCH / s) for n, s in step_s.items()},
        "vs_hashed": {n: round(step_s["hashed"] / s, 3) for n, s in step_s.items()},
        "collisionless_ids_held": len(emb),
        "collisionless_evictions": int(emb.evictions),
        "publish": _publishes(runs["hashed + row tracking"], step_s["hashed + row tracking"]),
    }
    runs["hashed + row tracking"].publisher.detach()
    return out


def main() -> None:
    ap = parser(__doc__, doc_option=False)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: steady numbers on a shared 2-core machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    batches = _batches(STEPS * (args.repeats + 1) * 3 + 200)
    results = [bench_size(v, batches, args.repeats) for v in args.sizes]
    path = write_result("rec_tables", {"batch": BATCH, "results": results})
    print("| rows/feature | hashed rec/s | collisionless rec/s (x) | tracking rec/s (x) | "
          "full publish | delta after 2 s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        rps, x, p = r["records_per_s"], r["vs_hashed"], r["publish"]
        print(f"| {r['vocab_per_feature']:,} | {rps['hashed']:,} | {rps['collisionless']:,} "
              f"({x['collisionless']}) | {rps['hashed + row tracking']:,} "
              f"({x['hashed + row tracking']}) | {p['full_bytes'] / 1e6:.1f} MB, "
              f"{p['full_s']} s | {p['delta_bytes'] / 1e6:.2f} MB ({p['delta_rows']:,} rows, "
              f"{100 * p['delta_fraction']:.1f} %), {p['delta_s']} s |")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
