"""AdaSum's combination by hand: two deltas, and the recursive-doubling tree over ranks."""

from __future__ import annotations

import pytest
import torch

from lit_amp.boost.adasum.maths import (
    EPS,
    SegmentLayout,
    adasum_combine,
    adasum_reduce,
    combine_rows,
)


def test_combination_of_two_deltas_by_hand():
    a = torch.tensor([3.0, 0.0, 0.0])
    b = torch.tensor([1.0, 2.0, 0.0])
    # a·b = 3, |a|² = 9, |b|² = 5 -> (1 - 3/18) a + (1 - 3/10) b = (5/6) a + 0.7 b
    torch.testing.assert_close(adasum_combine(a, b), torch.tensor([3.2, 1.4, 0.0]))
    # symmetric; identical deltas are averaged (kept); orthogonal ones are summed
    torch.testing.assert_close(adasum_combine(a, b), adasum_combine(b, a))
    torch.testing.assert_close(adasum_combine(a, a), a)
    torch.testing.assert_close(
        adasum_combine(a, torch.tensor([0.0, 0.0, 4.0])), torch.tensor([3.0, 0.0, 4.0])
    )
    # opposite deltas: (1 + 1/2) a + (1 + 1/2)(-a) = 0
    torch.testing.assert_close(adasum_combine(a, -a), torch.zeros(3))
    # zero deltas stay zero (eps guards the division)
    torch.testing.assert_close(adasum_combine(torch.zeros(2), torch.zeros(2)), torch.zeros(2))
    assert EPS == 1e-12
    with pytest.raises(ValueError, match="same shape"):
        adasum_combine(torch.zeros(2), torch.zeros(3))


def test_reduce_is_per_tensor_and_recursive_doubling():
    r = [
        [torch.tensor([1.0, 0.0]), torch.tensor([2.0])],
        [torch.tensor([0.0, 1.0]), torch.tensor([4.0])],
        [torch.tensor([1.0, 1.0]), torch.tensor([6.0])],
    ]
    out = adasum_reduce(r)
    pair = adasum_combine(r[0][0], r[1][0])  # (0,1) first, then with rank 2
    torch.testing.assert_close(out[0], adasum_combine(pair, r[2][0]))
    torch.testing.assert_close(out[1], torch.tensor([4.0]))  # single elements: averaged
    with pytest.raises(ValueError, match="at least one rank"):
        adasum_reduce([])


def test_flat_rows_combine_segment_by_segment():
    """The flat form the exchanges use equals the tensor-by-tensor combination."""
    g = torch.Generator().manual_seed(0)
    shapes = [torch.Size([3, 2]), torch.Size([1]), torch.Size([4])]
    ranks = [[torch.randn(s, generator=g) for s in shapes] for _ in range(4)]
    layout = SegmentLayout(shapes, torch.device("cpu"))
    flat = combine_rows([torch.cat([t.reshape(-1) for t in r]) for r in ranks], layout)
    expected = torch.cat([t.reshape(-1) for t in adasum_reduce(ranks)])
    torch.testing.assert_close(flat, expected)
