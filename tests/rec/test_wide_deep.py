"""The example recommender (``lit_amp.rec.wide_deep``): WideDeep's shapes and hashing, LazyAdam
against Adam and SparseAdam, and WideDeep learning the synthetic clicks."""

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


def test_lazy_adam_equals_adam_on_dense_gradients():
    torch.manual_seed(0)
    a = nn.Linear(5, 3)
    b = nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    oa, ob = torch.optim.Adam(a.parameters(), lr=0.05), LazyAdam(b.parameters(), lr=0.05)
    for _ in range(5):
        x = torch.randn(8, 5)
        for net, opt in ((a, oa), (b, ob)):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q)


def test_lazy_adam_updates_only_touched_rows_like_sparse_adam():
    torch.manual_seed(0)
    e1 = nn.Embedding(20, 4, sparse=True)
    e2 = nn.Embedding(20, 4, sparse=True)
    e2.load_state_dict(e1.state_dict())
    o1, o2 = torch.optim.SparseAdam(e1.parameters(), lr=0.1), LazyAdam(e2.parameters(), lr=0.1)
    before = e2.weight.detach().clone()
    for idx in ([1, 2, 2], [2, 5]):
        for emb, opt in ((e1, o1), (e2, o2)):
            opt.zero_grad()
            emb(torch.tensor(idx)).sum().backward()
            opt.step()
    torch.testing.assert_close(e1.weight, e2.weight)
    untouched = [i for i in range(20) if i not in (1, 2, 5)]
    assert torch.equal(e2.weight[untouched], before[untouched])


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
