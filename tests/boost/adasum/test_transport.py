"""AdaSum's exchanges across processes (gloo): vector halving against the all-gather reference.

Every world size and block size must give the combination :func:`adasum_reduce` computes
without communication, the same bits on every rank, and about 2N floats sent per rank.
"""

from __future__ import annotations

import pytest
import torch

from lit_amp.boost.adasum.maths import EPS, SegmentLayout, adasum_reduce
from lit_amp.boost.adasum.transport import (
    TRAFFIC,
    VectorHalving,
    adasum_allreduce_,
    allgather_exchange,
    exchange,
)
from tests.helpers.dist import run_distributed

_SHAPES = [(7, 5), (1,), (13,), (3, 2, 2), (1, 1), (9,)]


def _deltas(rank: int, local_size: int) -> list[torch.Tensor]:
    # ranks of one block hold the same (block-averaged) deltas, as under AdaSum's comm hook
    g = torch.Generator().manual_seed(7 + rank // local_size)
    return [torch.randn(s, generator=g) for s in _SHAPES]


def _halving_worker(rank: int, world: int, local_sizes: tuple[int, ...]) -> list[dict]:
    torch.set_num_threads(1)
    results = []
    for local_size in local_sizes:  # one spawn for several block sizes
        ts = _deltas(rank, local_size)
        flat = torch.cat([t.reshape(-1) for t in ts])
        layout = SegmentLayout([t.shape for t in ts], flat.device)
        bufs = [torch.full((3,), float(rank)), torch.arange(2.0) * rank]
        TRAFFIC["bytes_sent"] = 0
        new, new_mean = exchange(flat.clone(), layout, None, local_size, bufs)
        halving_bytes = TRAFFIC["bytes_sent"]
        # the halving itself, also where exchange() prefers the all-gather (2 ranks)
        halved = VectorHalving(layout, None, local_size, EPS).run(flat.clone())
        TRAFFIC["bytes_sent"] = 0
        ref, ref_mean = allgather_exchange(flat.clone(), layout, None, local_size, bufs)
        public = [t.clone() for t in ts]
        adasum_allreduce_(public, local_size=local_size)
        results.append({
            "new": new, "ref": ref, "halved": halved, "new_mean": new_mean,
            "ref_mean": ref_mean, "public": torch.cat([t.reshape(-1) for t in public]),
            "bytes": (halving_bytes, TRAFFIC["bytes_sent"]), "n": flat.numel(),
        })
    return results


def _close(x: torch.Tensor, ref: torch.Tensor) -> None:
    """float32 sums in another order: within 1e-6 of the vector's norm."""
    assert (x - ref).norm() <= 1e-6 * ref.norm(), ((x - ref).norm(), ref.norm())
    torch.testing.assert_close(x, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "world,local_sizes",
    [
        (2, (1,)),
        (3, (1,)),  # the odd rank is carried up, then sends its halves to ranks 0 and 1
        # local_size 2: blocks; ranks 0 and 2 combine, ranks 1 and 3 only receive the result
        (4, (1, 2)),
        # a cut-short subtree (ranks 4-6) that is itself cut short, and 3 blocks of 2
        pytest.param(7, (1,), marks=pytest.mark.slow),
        pytest.param(6, (2,), marks=pytest.mark.slow),
    ],
)
def test_halving_exchange_matches_the_allgather_reference(world, local_sizes):
    out = run_distributed(_halving_worker, world=world, args=(local_sizes,))
    for i, local_size in enumerate(local_sizes):
        # the reference, computed without communication from every block's deltas
        blocks = [_deltas(r, local_size) for r in range(0, world, local_size)]
        expected = torch.cat([t.reshape(-1) for t in adasum_reduce(blocks)])
        rows = [per_rank[i] for per_rank in out]
        for r in rows:
            torch.testing.assert_close(r["ref"], expected, rtol=1e-6, atol=1e-7)
            _close(r["new"], r["ref"])
            _close(r["halved"], r["ref"])
            _close(r["public"], r["ref"])
            torch.testing.assert_close(r["new_mean"], r["ref_mean"], rtol=1e-6, atol=1e-7)
            # every rank ends with the same bits (weights stay identical across ranks)
            for key in ("halved", "new", "new_mean"):
                assert torch.equal(r[key], rows[0][key]), key
        if local_size == 1 and world == 4:
            # sent per rank: ~2N floats (halving + final gather), not (world-1) x N
            new_b, old_b = rows[0]["bytes"]
            n = rows[0]["n"]
            assert old_b >= 3 * n * 4 and new_b <= 2.5 * n * 4 + 200, (new_b, old_b)
