"""Constant-memory AUC for streams: a binned ROC AUC over a sliding window of records.

:func:`binned_auc` is the functional core (score histograms of positives and negatives ->
AUC); :class:`SlidingWindowAUC` keeps ``num_chunks`` such histograms in a ring, so its memory
is ``2 * num_chunks * num_bins`` counters whatever the stream length, and its value covers
the last ``window`` records (to within one chunk).
"""

from __future__ import annotations

from typing import Any

import torch
from torchmetrics import Metric

__all__ = ["binned_auc", "SlidingWindowAUC"]


def binned_auc(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """ROC AUC from per-bin counts of positives and negatives (bins in increasing score).

    Ties within a bin count one half, as in the exact AUC with tied scores; with ``num_bins``
    bins over [0, 1] the error is at most the share of pairs that fall in the same bin.

    Returns:
        A 0-d float64 tensor; NaN when there is no positive or no negative.

    Example:
        >>> binned_auc(torch.tensor([0., 0., 2.]), torch.tensor([2., 0., 0.]))
        tensor(1., dtype=torch.float64)
        >>> binned_auc(torch.tensor([1., 1.]), torch.tensor([1., 1.]))
        tensor(0.5000, dtype=torch.float64)
    """
    pos = pos.double()
    neg = neg.double()
    n_pos, n_neg = pos.sum(), neg.sum()
    if n_pos == 0 or n_neg == 0:
        return torch.tensor(float("nan"), dtype=torch.float64)
    neg_below = torch.cumsum(neg, 0) - neg
    return (pos * (neg_below + 0.5 * neg)).sum() / (n_pos * n_neg)


class SlidingWindowAUC(Metric):
    """Binned ROC AUC over (about) the last ``window`` records, in constant memory.

    ``update(preds, target)`` takes scores (logits when ``from_logits``, else probabilities in
    [0, 1]) and 0/1 labels. Records fill the current chunk of ``window // num_chunks``
    records; a full chunk moves the ring on, and the oldest chunk is forgotten when the next
    record arrives, so :meth:`compute` covers between ``window - window // num_chunks`` and
    ``window`` of the latest records.
    Under DDP the histograms are summed over processes.

    Args:
        window: records in the window.
        num_chunks: ring size (the window's granularity).
        num_bins: score bins in [0, 1].
        from_logits: apply a sigmoid to ``preds`` first.

    Raises:
        ValueError: non-positive sizes, or ``window < num_chunks``.

    Example:
        >>> m = SlidingWindowAUC(window=4, num_chunks=2, from_logits=False)
        >>> m.update(torch.tensor([0.9, 0.1]), torch.tensor([1, 0]))
        >>> m.update(torch.tensor([0.2, 0.8]), torch.tensor([1, 0]))
        >>> round(float(m.compute()), 2)
        0.75
        >>> m.update(torch.tensor([0.3, 0.7]), torch.tensor([1, 0]))  # the first chunk leaves
        >>> round(float(m.compute()), 2)
        0.0
    """

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(
        self,
        window: int = 100_000,
        num_chunks: int = 10,
        num_bins: int = 1000,
        from_logits: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        for name, v in (("window", window), ("num_chunks", num_chunks), ("num_bins", num_bins)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(
                    f"For 'SlidingWindowAUC', the argument '{name}' must be a positive int, but "
                    f"got {v!r}."
                )
        if window < num_chunks:
            raise ValueError(
                f"For 'SlidingWindowAUC', 'window' ({window}) must be >= 'num_chunks' "
                f"({num_chunks})."
            )
        self.window, self.num_chunks, self.num_bins = window, num_chunks, num_bins
        self.chunk_size = window // num_chunks
        self.from_logits = bool(from_logits)
        zeros = torch.zeros(num_chunks, num_bins, dtype=torch.float64)
        self.add_state("pos", default=zeros.clone(), dist_reduce_fx="sum")
        self.add_state("neg", default=zeros.clone(), dist_reduce_fx="sum")
        self._head = 0
        self._fill = 0

    def reset(self) -> None:
        """Forget everything (the window restarts empty)."""
        super().reset()
        self._head = 0
        self._fill = 0

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Add a batch of scores and 0/1 labels."""
        p = preds.detach().reshape(-1).float()
        if self.from_logits:
            p = torch.sigmoid(p)
        y = target.detach().reshape(-1)
        if p.numel() != y.numel():
            raise ValueError(
                f"For 'SlidingWindowAUC.update', 'preds' and 'target' must have the same number "
                f"of elements, but got {p.numel()} and {y.numel()}."
            )
        bins = (p.clamp(0.0, 1.0) * self.num_bins).long().clamp_(max=self.num_bins - 1)
        is_pos = y > 0.5
        start, n = 0, bins.numel()
        while start < n:
            if self._fill == 0:  # entering a chunk: forget what it held a window ago
                self.pos[self._head].zero_()
                self.neg[self._head].zero_()
            take = min(self.chunk_size - self._fill, n - start)
            b, pos = bins[start : start + take], is_pos[start : start + take]
            self.pos[self._head] += torch.bincount(b[pos], minlength=self.num_bins).double()
            self.neg[self._head] += torch.bincount(b[~pos], minlength=self.num_bins).double()
            self._fill += take
            start += take
            if self._fill == self.chunk_size:
                self._head = (self._head + 1) % self.num_chunks
                self._fill = 0

    def compute(self) -> torch.Tensor:
        """The AUC over the window (NaN while it holds no positive or no negative)."""
        return binned_auc(self.pos.sum(0), self.neg.sum(0))
