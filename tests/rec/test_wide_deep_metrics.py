"""WideDeep, LazyAdam and the binned sliding-window AUC."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_amp.rec import (
    LazyAdam,
    RecModel,
    SlidingWindowAUC,
    ValidationOptions,
    WideDeep,
    binned_auc,
)
from lit_amp.rec.sources import SyntheticClickSource
from tests.rec._helpers import Recorder


def exact_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())


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


def test_binned_auc_matches_the_exact_auc():
    g = torch.Generator().manual_seed(0)
    labels = (torch.rand(3000, generator=g) < 0.3).float()
    scores = torch.sigmoid(torch.randn(3000, generator=g) + 1.5 * labels)
    m = SlidingWindowAUC(window=10_000, num_chunks=10, num_bins=1000, from_logits=False)
    m.update(scores, labels)
    assert abs(float(m.compute()) - exact_auc(scores, labels)) < 2e-3


def test_sliding_window_forgets_old_records_in_constant_memory():
    m = SlidingWindowAUC(window=1000, num_chunks=4, num_bins=100)
    g = torch.Generator().manual_seed(1)
    y = (torch.rand(2000, generator=g) < 0.5).float()
    m.update(torch.where(y > 0, 3.0, -3.0), y)  # perfectly ranked
    assert float(m.compute()) == 1.0
    size = m.pos.numel() + m.neg.numel()
    y2 = (torch.rand(1000, generator=g) < 0.5).float()
    m.update(torch.where(y2 > 0, -3.0, 3.0), y2)  # then perfectly wrong: the window slides
    assert float(m.compute()) < 0.3
    assert m.pos.numel() + m.neg.numel() == size == 2 * 4 * 100
    m.reset()
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert torch.isnan(m.compute())
    assert torch.isnan(binned_auc(torch.zeros(3), torch.ones(3)))


def test_sliding_window_auc_as_a_validation_metric():
    net = WideDeep(vocab_size=100, embed_dim=4, hidden=(8,))
    model = RecModel(
        net,
        nn.BCEWithLogitsLoss(),
        torch.optim.Adam(net.parameters(), 1e-2),
        metrics={"auc": SlidingWindowAUC(window=5000)},
    )
    rec = Recorder()
    model.online_train(
        SyntheticClickSource(batch_size=64, num_records=64 * 6),
        callbacks=rec,
        validation=ValidationOptions(valid_every_n_steps=3, valid_window=2),
    )
    assert 0.0 <= rec.metrics_seen[-1]["auc"] <= 1.0


def test_sliding_window_auc_bad_arguments():
    with pytest.raises(ValueError, match="'window' \\(3\\) must be >= 'num_chunks'"):
        SlidingWindowAUC(window=3, num_chunks=4)
    with pytest.raises(ValueError, match="same number of elements"):
        SlidingWindowAUC().update(torch.zeros(3), torch.zeros(2))
