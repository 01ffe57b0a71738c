"""``lit_amp._sparse.coalesced``: torch's ``coalesce`` without the sort where indices are
already sorted and distinct (WideDeep's embedding gradients), the same tensor otherwise."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_amp._sparse import coalesced
from lit_amp.rec import WideDeep


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=40), st.booleans(), st.integers(1, 3))
def test_coalesced_equals_torchs_coalesce(rows, sort, width):
    if sort:
        rows = sorted(set(rows))
    idx = torch.tensor([rows], dtype=torch.long).reshape(1, -1)
    vals = torch.arange(len(rows) * width, dtype=torch.float32).reshape(len(rows), width)
    t = torch.sparse_coo_tensor(idx, vals, (31, width))
    want = t.coalesce()
    got = coalesced(torch.sparse_coo_tensor(idx, vals, (31, width)))
    assert got.is_coalesced()
    assert torch.equal(got._indices(), want._indices())
    assert torch.equal(got._values(), want._values())


def test_a_two_dimensional_index_is_coalesced_by_torch():
    t = torch.sparse_coo_tensor(torch.tensor([[0, 0], [1, 1]]), torch.ones(2), (2, 2))
    assert torch.equal(coalesced(t).to_dense(), torch.tensor([[0.0, 2.0], [0.0, 0.0]]))


def test_wide_deeps_embedding_gradient_is_marked_not_sorted():
    """Looked up once per distinct row, the gradient's rows are sorted and distinct: it is
    marked coalesced in place (no copy), with torch's values."""
    net = WideDeep(vocab_size=1000, embed_dim=4, hidden=(8,), sparse=True)
    batch = {"dense": torch.rand(64, 13), "cat": torch.randint(0, 10**6, (64, 26))}
    net(batch).sum().backward()
    g = net.embedding.weight.grad
    assert g.is_sparse and not g.is_coalesced()
    want = g.coalesce()
    assert coalesced(g) is g and g.is_coalesced()
    assert torch.equal(g._indices(), want._indices()) and torch.equal(g._values(), want._values())


def test_a_tensor_that_requires_grad_is_coalesced_by_torch():
    """Marking is an in-place change, which autograd refuses on a leaf that requires grad."""
    t = torch.sparse_coo_tensor(torch.tensor([[1, 4]]), torch.ones(2, 2), (9, 2),
                                requires_grad=True)
    got = coalesced(t)
    assert got.is_coalesced() and got is not t and torch.equal(got.to_dense(), t.to_dense())
