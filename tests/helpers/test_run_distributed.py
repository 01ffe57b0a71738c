"""The shared gloo harness itself: results per rank, and a failing rank fails the test."""

import torch

from tests.helpers.dist import run_distributed


def _w(rank, world, scale):
    t = torch.tensor([float(rank)]) * scale
    torch.distributed.all_reduce(t)
    return t.item()

def _bad(rank, world):
    if rank == 1:
        raise ValueError("boom")
    return 0

def test_it():
    assert run_distributed(_w, args=(2.0,)) == [2.0, 2.0]

def test_bad():
    import pytest
    with pytest.raises(AssertionError, match="boom"):
        run_distributed(_bad)
