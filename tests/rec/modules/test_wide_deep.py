"""The example recommender (``lit_amp.rec.modules.wide_deep``): WideDeep's shapes and hashing,
and WideDeep learning the synthetic clicks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_amp.rec import LazyAdam, RecModel, WideDeep
from lit_amp.rec.sources import SyntheticClickSource
from tests.rec._helpers import exact_auc


def test_wide_deep_shapes_hashing_and_tuple_input():
    net = WideDeep(vocab_size=10, embed_dim=3, hidden=(8, 4))
    f, y = next(iter(SyntheticClickSource(batch_size=6, vocab_size=10**6)))
    out = net(f)
    assert out.shape == (6,) and out.dtype == torch.float32
    assert torch.equal(net((f["dense"], f["cat"])), out)
    big = dict(f, cat=f["cat"] + 10)  # ids are hashed modulo vocab_size: same rows
    assert torch.equal(net(big), out)
    with pytest.raises(ValueError, match="'vocab_size' must be a positive int"):
        WideDeep(vocab_size=0)


def test_wide_deep_learns_the_synthetic_clicks():
    torch.manual_seed(0)
    net = WideDeep(vocab_size=1000, embed_dim=8, hidden=(32,), sparse=True)
    model = RecModel(net, nn.BCEWithLogitsLoss(), LazyAdam(net.parameters(), lr=0.01))
    model.online_train(SyntheticClickSource(batch_size=256, num_records=256 * 120, seed=1))
    held_out = SyntheticClickSource(batch_size=4000, seed=1)  # same click model, unseen batch
    f, y = held_out.schema.to_batch(held_out.columns(10**6))
    with torch.no_grad():
        auc = exact_auc(net(f), y)
    assert auc > 0.65
