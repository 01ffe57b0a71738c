"""What is particular to ``SyntheticClickSource`` (``lit_amp.rec.sources.synthetic``): seeding,
resuming, Criteo-like learnable records, rate and shards, argument checks. What every source must
do is in test_contract.py."""

from __future__ import annotations

import time

import pytest
import torch

from lit_amp.rec.sources import SyntheticClickSource
from tests.rec.sources.contract import ids_of


def test_synthetic_is_seeded_and_resumable():
    a = SyntheticClickSource(batch_size=8, num_records=40, seed=5)
    b = SyntheticClickSource(batch_size=8, num_records=40, seed=5)
    it = iter(b)
    head = [next(it), next(it)]
    c = SyntheticClickSource(batch_size=8, num_records=40, seed=5)
    c.load_state_dict(b.state_dict())
    whole = list(a)
    rest = list(c)
    for x, y in zip(whole, head + rest):
        assert torch.equal(x[0]["cat"], y[0]["cat"]) and torch.equal(x[1], y[1])
    assert ids_of(whole) == list(range(40))
    other = next(iter(SyntheticClickSource(8, seed=6)))
    assert not torch.equal(whole[0][0]["cat"], other[0]["cat"])


def test_synthetic_looks_like_criteo_and_is_learnable():
    cols = SyntheticClickSource(batch_size=20000, seed=0).columns(0)
    assert cols["dense"].shape == (20000, 13) and cols["cat"].shape == (20000, 26)
    assert 0.1 < cols["label"].mean() < 0.5
    # the hidden model makes the label depend on the features
    cat0 = cols["cat"][:, 0]
    rates = [cols["label"][cat0 == v].mean() for v in range(3)]
    assert max(rates) - min(rates) > 0.05


def test_synthetic_rate_and_shards():
    src = SyntheticClickSource(batch_size=10, num_records=60, rate=300.0)
    t0 = time.monotonic()
    list(src)
    assert time.monotonic() - t0 >= 0.15  # 60 records at 300/s
    parts = [
        ids_of(SyntheticClickSource(batch_size=10, num_records=60, rank=r, world_size=2))
        for r in range(2)
    ]
    assert parts[0][:10] == list(range(10)) and parts[1][:10] == list(range(10, 20))
    assert sorted(parts[0] + parts[1]) == list(range(60))


def test_synthetic_bad_arguments():
    with pytest.raises(ValueError, match="'rate' must be a positive number"):
        SyntheticClickSource(rate=0)
    with pytest.raises(ValueError, match="'batch_size' must be a positive int"):
        SyntheticClickSource(batch_size=0)
