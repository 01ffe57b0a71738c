"""The collectives ``online_train`` needs under DDP (no-ops in one process).

Example:
    >>> Ranks().reduce_max([0, 1]), Ranks().gather("cursor")
    ([0, 1], ['cursor'])
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Ranks", "raise_held"]


class Ranks:
    """This process's place among the DDP ranks, and the collectives over them.

    Args:
        world: the number of processes.
        rank: this process's global rank.
        device: where collectives' tensors live (CPU for gloo).
    """

    def __init__(self, world: int = 1, rank: int = 0, device: torch.device | None = None) -> None:
        self.world = world
        self.rank = rank
        self.device = device or torch.device("cpu")

    def reduce_max(self, values: list[int]) -> list[int]:
        """The element-wise maximum of ``values`` over all ranks."""
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.int32, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return [int(v) for v in t.tolist()]

    def reduce_sum(self, values: list[int]) -> list[int]:
        """The element-wise sum of ``values`` over all ranks."""
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.int64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return [int(v) for v in t.tolist()]

    def agree(self, has_batch: bool, can_step: bool, needs_filler: bool = False
              ) -> tuple[int, bool, bool]:
        """One all-reduce before a step: ``(ranks with a batch, every rank can step, some rank
        needs a filler template)``.

        Example:
            >>> Ranks().agree(True, True)
            (1, True, False)
        """
        having, cannot, needing = self.reduce_sum(
            [int(has_batch), int(not can_step), int(needs_filler)]
        )
        return having, cannot == 0, needing > 0

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` of every rank, indexed by rank."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        """Wait for every rank (nothing in one process)."""
        if self.world > 1:
            torch.distributed.barrier()


def raise_held(error: BaseException | None, message: str) -> None:
    """Raise a failure the ranks agreed to stop on: this rank's own ``error``, or (another rank
    failed) a ``RuntimeError`` with ``message``."""
    if error is not None:
        raise error
    raise RuntimeError(message)
