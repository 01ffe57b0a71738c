"""lit_amp._runtime: the process's facts and the small collectives every layer agrees through.

In one process each collective returns its input; under a 2-process gloo group they reduce,
gather and wait across the ranks.
"""

from __future__ import annotations

import torch

from lit_amp import _runtime as rt
from tests.helpers.dist import run_distributed


def test_without_a_process_group_the_collectives_return_their_input():
    assert (rt.dist_ready(), rt.rank(), rt.world_size()) == (False, 0, 1)
    assert rt.reduce_device() == torch.device("cpu")
    assert (rt.any_rank(False), rt.any_rank(True)) == (False, True)
    assert rt.reduce_mean(1.5) == 1.5
    assert (rt.reduce_sum([1, 2]), rt.reduce_max([3])) == ([1, 2], [3])
    assert rt.gather({"a": 1}) == [{"a": 1}]
    rt.barrier()


def _worker(rank: int, world: int) -> tuple:
    torch.set_num_threads(1)
    out = (rt.rank(), rt.world_size(), rt.any_rank(rank == 1), rt.any_rank(False),
           rt.reduce_mean(float(rank)), rt.reduce_sum([rank, 1]), rt.reduce_max([rank, -rank]),
           rt.gather(f"r{rank}"))
    rt.barrier()
    return out


def test_under_a_process_group_the_ranks_agree():
    for rank, got in enumerate(run_distributed(_worker, world=2)):
        assert got == (rank, 2, True, False, 0.5, [1, 2], [1, 0], ["r0", "r1"])
