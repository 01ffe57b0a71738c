"""What reading one stream shard costs the online loop: ``np.load`` and the row-by-row check
(the code before) against :func:`~lit_amp.rec.sources.npz.read_npz` and the check's
whole-array shortcut for clean shards.

``DirectorySource`` reads a shard in the training loop at every step (one 4,096-record shard
per step in the 26 M-row benchmark, ``bench/online/paired.py``), so the shard's read and check
are paid per step. The shards are ``np.savez`` files of ``SyntheticClickSource`` columns, in
the page cache. Both variants read the same shards in interleaved rounds; the result is the
median time per shard and the median per-round ratio. Writes ``bench/results/shard_read.json``.

    .venv/bin/python -m bench.online.shard_read
"""

from __future__ import annotations

import statistics
import tempfile

import numpy as np
import torch

from bench._common import measure, parser, write_result
from lit_amp.rec.sources import SyntheticClickSource, write_shard
from lit_amp.rec.sources.npz import read_npz
from lit_amp.rec.sources.schema import ClickSchema


class _RowByRow(ClickSchema):
    """The check as it was: per-row masks and copies for every shard."""

    def _clean(self, *args: object) -> bool:
        return False


def main() -> None:
    o = parser(__doc__, doc_option=False, batch=4096, shards=100, repeats=15).parse_args()
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

    m = measure({"after": after, "before": before}, o.repeats)
    per_shard = {k: v / o.shards for k, v in m.medians().items()}
    ratios = m.ratios("before")
    result = {
        "options": vars(o),
        "ms_per_shard": {k: round(v * 1e3, 4) for k, v in per_shard.items()},
        "speedup_median": round(statistics.median(ratios), 3),
        "speedup_per_round": [round(r, 3) for r in ratios],
        "speedup_interval_90": m.interval("before"),
    }
    write_result("shard_read", result)
    print(result["ms_per_shard"], "speed-up", result["speedup_median"])


if __name__ == "__main__":
    main()
