"""``SyntheticClickSource``: a seeded, Criteo-like click log, for demos, tests and benchmarks."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from lit_amp.rec.sources.base import StreamSource, resolve_shard
from lit_amp.rec.sources.schema import ClickSchema, Columns

__all__ = ["SyntheticClickSource"]

log = logging.getLogger(__name__)

_EFFECT_BUCKETS = 997  # hidden per-id click effects are looked up modulo this


def _check_pos_int(name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(
            f"For 'SyntheticClickSource', the argument '{name}' must be a positive int"
            f"{' or None' if allow_none else ''}, but got {value!r}."
        )


class SyntheticClickSource(StreamSource):
    """An endless (or ``num_records``-long) seeded stream of Criteo-like click records.

    Each record has 13 log-normal dense counts, 26 categorical ids drawn from a heavy-tailed
    (Zipf) distribution over ``vocab_size`` ids per feature, and a label drawn from a hidden
    logistic model of both (so a model can learn it: AUC well above 0.5, CTR about 25%).
    Record ``i`` has id ``i``; batch ``b`` holds ids ``[b * batch_size, (b + 1) * batch_size)``
    and depends only on ``(seed, b)``, so a restored cursor reproduces the stream exactly.

    Sharding: batch ``b`` goes to shard ``b % num_shards`` (ranks x DataLoader workers).

    Args:
        batch_size: records per batch.
        rate: records per second to emit (None: as fast as possible).
        num_records: total records (None: endless).
        seed: the stream seed.
        num_dense, num_cat: features per record.
        vocab_size: distinct ids per categorical feature.
        rank, world_size: shard explicitly (default: from ``torch.distributed``).

    Raises:
        ValueError: a non-positive size, rate or count.

    Example:
        >>> src = SyntheticClickSource(batch_size=4, num_records=10, seed=1)
        >>> [b[0]["record_id"].tolist() for b in src]
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        >>> src.state_dict()
        {'batches': 3}
    """

    def __init__(
        self,
        batch_size: int = 1000,
        *,
        rate: float | None = None,
        num_records: int | None = None,
        seed: int = 0,
        num_dense: int = 13,
        num_cat: int = 26,
        vocab_size: int = 100_000,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__(name="SyntheticClickSource")
        _check_pos_int("batch_size", batch_size)
        _check_pos_int("num_records", num_records, allow_none=True)
        _check_pos_int("vocab_size", vocab_size)
        if rate is not None and (
            isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0
        ):
            raise ValueError(
                "For 'SyntheticClickSource', the argument 'rate' must be a positive number of "
                f"records per second or None, but got {rate!r}."
            )
        self.schema = ClickSchema(num_dense, num_cat)
        self.batch_size = batch_size
        self.rate = rate
        self.num_records = num_records
        self.seed = int(seed)
        self.vocab_size = vocab_size
        self.rank, self.world_size = rank, world_size
        g = np.random.default_rng([self.seed, 0x5EED])
        self._cat_effect = g.normal(0.0, 1.0, (num_cat, _EFFECT_BUCKETS)).astype(np.float32)
        self._dense_w = g.normal(0.0, 0.35, num_dense).astype(np.float32)
        self._cursor = {"batches": 0}

    @property
    def num_batches(self) -> int | None:
        """Total batches of the whole stream (all shards), or None when endless."""
        if self.num_records is None:
            return None
        return -(-self.num_records // self.batch_size)

    def columns(self, batch_index: int) -> Columns:
        """The records of global batch ``batch_index`` as columns (what producers write).

        Example:
            >>> SyntheticClickSource(batch_size=3, seed=0).columns(2)["id"].tolist()
            [6, 7, 8]
        """
        start = batch_index * self.batch_size
        n = self.batch_size
        if self.num_records is not None:
            n = max(0, min(n, self.num_records - start))
        g = np.random.default_rng([self.seed, batch_index])
        nd, nc = self.schema.num_dense, self.schema.num_cat
        dense = np.floor(g.lognormal(1.0, 1.2, (n, nd))).astype(np.float32)
        cat = ((g.zipf(1.3, (n, nc)) - 1) % self.vocab_size).astype(np.int64)
        # hidden click model: per-id effects plus a dense term
        effect = self._cat_effect[np.arange(nc), cat % _EFFECT_BUCKETS].sum(axis=1)
        logit = 0.45 * effect + np.log1p(dense) @ self._dense_w - 1.3
        label = (g.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return {
            "id": np.arange(start, start + n, dtype=np.int64),
            "label": label,
            "dense": dense,
            "cat": cat,
        }

    def _restore(self, state: dict[str, Any]) -> None:
        batches = state.get("batches")
        if not isinstance(batches, int) or batches < 0:
            raise ValueError(
                "For 'SyntheticClickSource.load_state_dict', 'batches' must be an int >= 0, "
                f"but got {batches!r}."
            )
        self._cursor = {"batches": batches}

    def __iter__(self) -> Iterator[Any]:
        shard, nshards = resolve_shard(self.rank, self.world_size)
        self.end_reason = None
        local = int(self._cursor["batches"])
        total = self.num_batches
        t0 = time.monotonic()
        emitted = 0
        while True:
            b = shard + local * nshards
            if total is not None and b >= total:
                self.end_reason = "source_exhausted"
                return
            cols = self.columns(b)
            if self.rate is not None:
                # records of all shards share the rate
                due = t0 + (emitted + len(cols["id"])) * nshards / self.rate
                while True:
                    wait = due - time.monotonic()
                    if wait <= 0:
                        break
                    if self._idle():
                        self.end_reason = "stopped"
                        return
                    self._sleep(min(wait, 0.05))
            local += 1
            emitted += len(cols["id"])
            self._cursor = {"batches": local}
            self.records_read += len(cols["id"])
            self.batches_read += 1
            yield self.schema.to_batch(cols)
