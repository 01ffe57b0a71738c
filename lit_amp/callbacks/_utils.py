"""Helpers shared by the built-in callbacks: loss extraction, monitors, rank tests.

Private module, framework-free (torch only). The argument checks live in
:mod:`lit_amp._validation` (one message format for the whole package).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from lit_amp._runtime import reduce_mean

__all__: list[str] = []

#: The ``mode`` values of EarlyStopping / ReduceLROnPlateau.
MONITOR_MODES = ("auto", "min", "max")

# Monitors for which MindSpore's ``mode='auto'`` picks "smaller is better".
SMALLER_BETTER_METRICS = frozenset(
    {
        "hausdorff_distance",
        "mae",
        "mse",
        "loss",
        "perplexity",
        "mean_surface_distance",
        "root_mean_square_distance",
        "eval_loss",
    }
)


def is_min_mode(mode: str, monitor: str) -> bool:
    """Whether smaller values of ``monitor`` are better under ``mode``."""
    return mode == "min" or (mode == "auto" and monitor in SMALLER_BETTER_METRICS)


def to_float(value: Any) -> float:
    """A tensor / array becomes the float of its mean; a number becomes a float."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.numel() != 1:
            value = value.float().mean()
        return float(value.float().item())
    if isinstance(value, np.ndarray):
        return float(np.mean(value))
    return float(value)


def handle_loss(net_outputs: Any) -> float | None:
    """The training loss in ``net_outputs`` as a float (MindSpore's ``_handle_loss``).

    A tensor gives the float of its mean; a tuple or list (``(loss, overflow, scale)`` under loss
    scaling) gives the float of its first element. ``None`` stays ``None``.
    """
    if net_outputs is None:
        return None
    if isinstance(net_outputs, (tuple, list)):
        if not net_outputs:
            return None
        net_outputs = net_outputs[0]
    return to_float(net_outputs)


def is_finite(value: float) -> bool:
    """Whether ``value`` is neither NaN nor +-Inf."""
    return not (math.isnan(value) or math.isinf(value))


def is_rank_zero(cb_params: dict) -> bool:
    """Whether this process is global rank 0 (``cb_params['rank']``, default 0)."""
    return cb_params.get("rank", 0) == 0


def monitor_value(owner: str, monitor: str, cb_params: dict) -> float | None:
    """The value of ``monitor`` at a train epoch end (EarlyStopping / ReduceLROnPlateau).

    ``"loss"`` reads ``net_outputs`` as :func:`handle_loss`; any other name reads
    ``cb_params['eval_results'][monitor]`` (available during ``fit``). Returns None (the caller
    logs a warning and skips the epoch) when the value is missing. A value of 0 is a real value.

    Raises:
        ValueError: the monitored value is not a scalar.
    """
    if monitor == "loss":
        raw = cb_params.get("net_outputs")
        if isinstance(raw, (tuple, list)):
            raw = raw[0] if raw else None
    else:
        raw = (cb_params.get("eval_results") or {}).get(monitor)
    if raw is None:
        return None
    if isinstance(raw, (list, tuple)):
        raw = np.asarray(raw, dtype=np.float64)
    if isinstance(raw, (torch.Tensor, np.ndarray)) and monitor != "loss":
        numel = raw.numel() if isinstance(raw, torch.Tensor) else raw.size
    else:
        numel = 1
    if numel != 1:
        raise ValueError(
            f"For '{owner}', the monitored value {monitor!r} must be a scalar, but got a value "
            f"of shape {tuple(raw.shape)}."
        )
    return reduce_mean(to_float(raw))


def available_monitors(cb_params: dict) -> list[str]:
    """The monitor names available now: "loss" plus the keys of ``eval_results``."""
    return ["loss", *sorted((cb_params.get("eval_results") or {}).keys())]


class ImprovementMixin:
    """``best``-tracking shared by EarlyStopping and ReduceLROnPlateau.

    Needs ``self._min_mode`` (from :func:`is_min_mode`) and ``self.min_delta``.
    """

    _min_mode: bool
    min_delta: float

    def _initial_best(self) -> float:
        return math.inf if self._min_mode else -math.inf

    def is_improvement(self, current: float, reference: float) -> bool:
        """Whether ``current`` improves on ``reference`` by more than ``min_delta``."""
        if self._min_mode:
            return current < reference - self.min_delta
        return current > reference + self.min_delta
