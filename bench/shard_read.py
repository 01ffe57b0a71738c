"""What reading one stream shard costs the online loop: ``np.load`` and the row-by-row check
(the code before) against :func:`~lit_amp.rec.sources.npz.read_npz` and the check's
whole-array shortcut for clean shards.

``DirectorySource`` reads a shard in the training loop at every step (one 4,096-record shard
per step in the 26 M-row benchmark, ``bench/online_paired.py``), so the shard's read and check
are paid per step. The shards are ``np.savez`` files of ``SyntheticClickSource`` columns, in
the page cache. Both variants read the same shards in interleaved rounds; the result is the
median time per shard and the median per-round ratio. Writes ``bench/results/shard_read.json``.

    .venv/bin/python bench/shard_read.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, write_result  # noqa: E402

from lit_amp.rec.sources import SyntheticClickSource, write_shard  # noqa: E402
from lit_amp.rec.sources.npz import read_npz  # noqa: E402
from lit_amp.rec.sources.schema import ClickSchema  # noqa: E402


class _RowByRow(ClickSchema):
    """The check as it was: per-row masks and copies for every shard."""

    def _clean(self, *args: object) -> bool:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--shards", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=15)
    o = ap.parse_args()
    torch.set_num_threads(1)
    folder = tempfile.mkdtemp()
    gen = SyntheticClickSource(batch_size=o.batch, seed=0)
    paths = [write_shard(folder, f"part-{i:06d}", gen.columns(i)) for i in range(o.shards)]
    old_schema, new_schema = _RowByRow(), ClickSchema()

    def before() -> None:
        for p in paths:
            with np.load(p, allow_pickle=False) as z:
                old_schema.check_columns({k: z[k] for k in z.files})

    def after() -> None:
        for p in paths:
            new_schema.check_columns(read_npz(p))

    times = interleaved({"before": before, "after": after}, o.repeats)
    per_shard = {k: statistics.median(v) / o.shards for k, v in times.items()}
    ratios = [b / a for b, a in zip(times["before"], times["after"])]
    result = {
        "options": vars(o),
        "ms_per_shard": {k: round(v * 1e3, 4) for k, v in per_shard.items()},
        "speedup_median": round(statistics.median(ratios), 3),
        "speedup_per_round": [round(r, 3) for r in ratios],
    }
    write_result("shard_read", result)
    print(result["ms_per_shard"], "speed-up", result["speedup_median"])


if __name__ == "__main__":
    main()
