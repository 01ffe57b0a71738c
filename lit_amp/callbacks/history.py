"""MindSpore's ``History``: record the network output and metrics of every epoch."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lit_amp.callbacks.base import Callback, RunContext

__all__ = ["History"]


def _net_output_value(net_output: Any) -> Any:
    if isinstance(net_output, (tuple, list)) and net_output:
        if isinstance(net_output[0], (torch.Tensor, np.ndarray)):
            net_output = net_output[0]
    if isinstance(net_output, torch.Tensor):
        return float(net_output.detach().float().mean().item())
    if isinstance(net_output, np.ndarray):
        return float(np.mean(net_output))
    return net_output


class History(Callback):
    """Record, at each epoch end, the epoch number, the network output and any metrics.

    ``epoch`` is MindSpore's dict ``{"epoch": [1, 2, ...]}``. ``history`` maps
    ``"net_output"`` (the mean of a tensor output, or of the first element of a tuple such as
    ``(loss, overflow, scale)``) and each name of ``cb_params.metrics`` (set during ``fit`` and
    ``eval``) to the list of its per-epoch values. Both are reset when a run begins. Uses the
    legacy hooks, so it records in ``train`` and stand-alone ``eval``; being a built-in, ``fit``
    does not call it during its per-epoch evaluation (the eval metrics arrive through
    ``cb_params.metrics`` at the train epoch end).

    Example:
        >>> import torch
        >>> from lit_amp.callbacks.base import RunContext
        >>> h = History()
        >>> h.begin(RunContext({}))
        >>> h.epoch_end(RunContext({"cur_epoch_num": 1, "net_outputs": torch.tensor([1.0, 2.0]),
        ...                         "metrics": {"acc": 0.5}}))
        >>> h.epoch, h.history
        ({'epoch': [1]}, {'net_output': [1.5], 'acc': [0.5]})
    """

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[str, list[Any]] = {}
        self.epoch: dict[str, list[int]] | None = None

    def begin(self, run_context: RunContext) -> None:
        """Reset ``epoch`` and ``history`` when a run begins."""
        self.epoch = {"epoch": []}
        self.history = {}

    def epoch_end(self, run_context: RunContext) -> None:
        """Append the epoch number, the network output and the metrics."""
        cb = run_context.original_args()
        if self.epoch is None:
            self.epoch = {"epoch": []}
        self.epoch["epoch"].append(cb.get("cur_epoch_num", 1))
        cur: dict[str, Any] = {"net_output": _net_output_value(cb.get("net_outputs"))}
        metrics = cb.get("metrics")
        if metrics:
            cur.update(metrics)
        for key, value in cur.items():
            self.history.setdefault(key, []).append(value)
