"""``lit_amp.rec.optim.LazyAdam`` against Adam (dense gradients) and SparseAdam (sparse ones)."""

from __future__ import annotations

import torch
from torch import nn

from lit_amp.rec.optim import LazyAdam


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
