"""GradientFreeze: on some steps, train only a suffix of the network (docs/semantics.md §3.3).

MindSpore's ``GradientFreeze(param_groups, freeze_type, freeze_p, total_steps)`` as a
functional core, :func:`split_parameter_groups` and :func:`freeze_schedule`, plus a callback
that applies the schedule: a frozen prefix skips its backward, which is where the speed-up
comes from. lit_amp follows MindSpore's documentation for ``freeze_p``, draws a seeded,
resumable schedule and keeps one optimizer (docs/differences.md, "Boost").

Example:
    >>> s = freeze_schedule(10, freeze_type=1, freeze_p=0.7, total_steps=1000, seed=0)
    >>> round(float((s != 0).mean()), 2)
    0.7
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from lit_amp.boost.base import BoostAlgorithm

__all__ = [
    "GradientFreeze",
    "split_parameter_groups",
    "freeze_schedule",
    "train_sets",
    "set_trainable_suffix",
]

log = logging.getLogger(__name__)

_NORM = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def _norm_param_ids(network: nn.Module) -> set[int]:
    return {id(p) for m in network.modules() if isinstance(m, _NORM) for p in m.parameters()}


def split_parameter_groups(
    named_params: Sequence[tuple[str, nn.Parameter]], sticky: set[int] | None = None
) -> list[list[nn.Parameter]]:
    """MindSpore's grouping of trainable parameters (see the module docstring).

    Args:
        named_params: ``(name, param)`` in forward order (``network.named_parameters()``).
        sticky: ids of further parameters that stick to the current group (norm layers).

    Example:
        >>> net = nn.Sequential(nn.Conv1d(1, 2, 3), nn.BatchNorm1d(2), nn.Conv1d(2, 2, 3))
        >>> [len(g) for g in split_parameter_groups(list(net.named_parameters()),
        ...                                          _norm_param_ids(net))]
        [4, 2]
    """
    sticky = sticky or set()
    groups: list[list[nn.Parameter]] = []
    cur: list[nn.Parameter] = []
    for name, p in named_params:
        if "bn" in name or "bias" in name or id(p) in sticky:
            cur.append(p)
        elif len(cur) >= 3:
            groups.append(cur)
            cur = [p]
        else:
            cur.append(p)
    if cur:
        groups.append(cur)
    return groups


def train_sets(groups: list[list[nn.Parameter]], param_groups: int) -> list[list[nn.Parameter]]:
    """MindSpore's train sets: set ``i`` = ``flatten(groups[i * stride:])``, ``i < param_groups``.

    Example:
        >>> ps = [nn.Parameter(torch.zeros(1)) for _ in range(4)]
        >>> [len(s) for s in train_sets([[p] for p in ps], 2)]
        [4, 2]
    """
    stride = len(groups) // param_groups
    return [[p for g in groups[i * stride :] for p in g] for i in range(param_groups)]


def freeze_schedule(
    param_groups: int,
    freeze_type: int = 1,
    freeze_p: float = 0.7,
    total_steps: int = 65536,
    seed: int = 0,
) -> np.ndarray:
    """The freeze index of every step (documented ``freeze_p`` semantics; int8 array).

    Args:
        param_groups: number of train sets ``N``; indices are in ``[0, N)``.
        freeze_type: 1 = interval (frozen steps interleaved), 0 = continuous blocks.
        freeze_p: fraction of steps that freeze a prefix, in ``[0, 1]``.
        total_steps: the schedule has ``int(total_steps * 1.01)`` entries (it wraps after).
        seed: seed of the numpy generator (interval strategy).

    Raises:
        ValueError: ``freeze_type`` not 0 or 1, ``freeze_p`` outside [0, 1], non-positive
            counts.

    Example:
        >>> freeze_schedule(4, freeze_type=0, freeze_p=0.5, total_steps=8).tolist()
        [0, 0, 0, 1, 2, 3, 0, 0]
    """
    if freeze_type not in (0, 1):
        raise ValueError(f"GradientFreeze: 'freeze_type' must be 0 or 1, but got {freeze_type!r}.")
    if not 0.0 <= freeze_p <= 1.0:
        raise ValueError(f"GradientFreeze: 'freeze_p' must be in [0, 1], but got {freeze_p!r}.")
    if param_groups < 1 or total_steps < 1:
        raise ValueError(
            "GradientFreeze: 'param_groups' and 'total_steps' must be positive, but got "
            f"{param_groups!r} and {total_steps!r}."
        )
    total = max(1, int(total_steps * 1.01))
    n = param_groups
    if n <= 1 or freeze_p == 0.0:
        return np.zeros(total, dtype=np.int16)
    if freeze_type == 0:
        # documented semantics: N-1 frozen steps per (N-1)/p steps -> z = (N-1)(1-p)/p zeros
        zeros = int((n - 1) * (1.0 - freeze_p) / freeze_p + 0.5)
        block = [0] * zeros + list(range(1, n))
        reps = -(-total // len(block))
        return np.asarray((block * reps)[:total], dtype=np.int16)
    # interval: the slot pattern is deterministic; only the frozen indices are random
    pattern = np.zeros(total, dtype=bool)
    zero_cnt, frozen_cnt = 1, 0
    for i in range(1, total):
        if frozen_cnt / (zero_cnt + frozen_cnt) < freeze_p:
            pattern[i] = True
            frozen_cnt += 1
        else:
            zero_cnt += 1
    choices = np.arange(n - 1, 0, -1)  # N-1 .. 1
    prob = np.arange(1, n, dtype=np.float64)  # weights 1 .. N-1: index k has weight N-k
    prob /= prob.sum()
    rng = np.random.default_rng(seed)
    out = np.zeros(total, dtype=np.int16)
    out[pattern] = rng.choice(choices, size=int(pattern.sum()), p=prob)
    return out


def set_trainable_suffix(
    params: Sequence[nn.Parameter], train: set[int], managed: set[int]
) -> None:
    """Set ``requires_grad`` to ``id(p) in train`` for every managed parameter."""
    for p in params:
        if id(p) in managed:
            want = id(p) in train
            if p.requires_grad != want:
                p.requires_grad_(want)


class GradientFreeze(BoostAlgorithm):
    """GradientFreeze as a Lightning callback (pure-torch hooks underneath).

    Args:
        param_groups: number of train sets (MindSpore default 10).
        freeze_type: 1 interval (default) or 0 continuous.
        freeze_p: fraction of steps that freeze a prefix (documented semantics; default 0.7).
        total_steps: schedule length before it wraps (default 65536).
        seed: schedule seed (default 0; the same on every rank).

    Attributes:
        position: optimizer steps taken under this schedule (saved in checkpoints).
        schedule: the index sequence (after :meth:`attach`).
        sets: the train sets, lists of parameters (after :meth:`attach`).

    Example:
        >>> net = nn.Sequential(*[nn.Linear(4, 4) for _ in range(6)])
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
        >>> gf = GradientFreeze(param_groups=3, freeze_p=1.0, freeze_type=0)
        >>> gf.attach(net, [opt])
        >>> _ = net(torch.randn(2, 4)).sum().backward()   # index 1: the first 2 layers frozen
        >>> [p.grad is None for p in net.parameters()][:5]
        [True, True, True, True, False]
        >>> gf.detach()
    """

    name = "grad_freeze"

    def __init__(
        self,
        param_groups: int = 10,
        freeze_type: int = 1,
        freeze_p: float = 0.7,
        total_steps: int = 65536,
        seed: int = 0,
    ) -> None:
        for arg, v in (
            ("param_groups", param_groups),
            ("total_steps", total_steps),
            ("seed", seed),
        ):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"GradientFreeze: '{arg}' must be an int, but got {v!r}.")
            if v < (0 if arg == "seed" else 1):
                raise ValueError(
                    f"GradientFreeze: '{arg}' must be {'>= 0' if arg == 'seed' else '> 0'}, but "
                    f"got {v!r}."
                )
        if isinstance(freeze_type, bool) or freeze_type not in (0, 1):
            raise ValueError(
                f"GradientFreeze: 'freeze_type' must be 0 or 1, but got {freeze_type!r}."
            )
        if isinstance(freeze_p, bool) or not isinstance(freeze_p, (int, float)):
            raise TypeError(f"GradientFreeze: 'freeze_p' must be a float, but got {freeze_p!r}.")
        if not 0.0 <= freeze_p <= 1.0:
            raise ValueError(f"GradientFreeze: 'freeze_p' must be in [0, 1], but got {freeze_p!r}.")
        self.param_groups = param_groups
        self.freeze_type = freeze_type
        self.freeze_p = float(freeze_p)
        self.total_steps = total_steps
        self.seed = seed
        self.position = 0
        self.schedule: np.ndarray | None = None
        self.sets: list[list[nn.Parameter]] = []
        self._set_ids: list[set[int]] = []
        self._params: list[nn.Parameter] = []
        self._managed: set[int] = set()
        self._current = -1
        self._handles: list[Any] = []

    @property
    def requires_find_unused_parameters(self) -> bool:
        return True

    @property
    def current_index(self) -> int:
        """The freeze index the next training forward uses."""
        if self.schedule is None:
            return 0
        return int(self.schedule[self.position % len(self.schedule)])

    def attach(
        self, network: nn.Module, optimizers: Sequence[torch.optim.Optimizer], **context: Any
    ) -> None:
        self.detach()
        named = [(n, p) for n, p in network.named_parameters() if p.requires_grad]
        groups = split_parameter_groups(named, _norm_param_ids(network))
        if len(groups) < self.param_groups:
            log.warning(
                "GradientFreeze: the network has %d parameter groups, fewer than "
                "param_groups=%d, so nothing is ever frozen (MindSpore behaves the same); "
                "lower param_groups.",
                len(groups),
                self.param_groups,
            )
        self.sets = train_sets(groups, self.param_groups)
        self._set_ids = [{id(p) for p in s} for s in self.sets]
        self._params = [p for _, p in named]
        self._managed = {id(p) for p in self._params}
        self.schedule = freeze_schedule(
            self.param_groups, self.freeze_type, self.freeze_p, self.total_steps, self.seed
        )
        self._current = -1
        self._handles.append(network.register_forward_pre_hook(_FreezePreForward(self)))
        for i, opt in enumerate(optimizers):
            self._handles.append(opt.register_step_pre_hook(_FreezeStepPre(self)))
            if i == 0:  # one advance per training step, whatever the number of optimizers
                self._handles.append(opt.register_step_post_hook(_FreezeStepPost(self)))

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        # also covers modules whose training_step calls a submodule, not ``self(...)``
        self.apply_index(self.current_index)

    def apply_index(self, index: int) -> None:
        """Make train set ``index`` trainable and freeze the rest (no-op if already so)."""
        if index == self._current or not self._set_ids:
            return
        set_trainable_suffix(self._params, self._set_ids[index], self._managed)
        self._current = index

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._params:
            set_trainable_suffix(self._params, self._managed, self._managed)
        self._current = -1

    def state_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "seed": self.seed,
            "param_groups": self.param_groups,
            "freeze_type": self.freeze_type,
            "freeze_p": self.freeze_p,
            "total_steps": self.total_steps,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        cfg = ("seed", "param_groups", "freeze_type", "freeze_p", "total_steps")
        diff = {
            k: (state_dict[k], getattr(self, k))
            for k in cfg
            if k in state_dict and state_dict[k] != getattr(self, k)
        }
        if diff:
            log.warning(
                "GradientFreeze: the checkpoint's schedule settings differ (saved, now): %s; "
                "resuming at position %s of the new schedule.",
                diff,
                state_dict.get("position"),
            )
        self.position = int(state_dict.get("position", 0))
        self._current = -1


class _FreezePreForward:
    def __init__(self, owner: GradientFreeze) -> None:
        self.owner = owner

    def __call__(self, module: nn.Module, args: Any) -> None:
        if module.training and torch.is_grad_enabled():
            self.owner.apply_index(self.owner.current_index)


class _FreezeStepPre:
    """Frozen parameters must not step, even if a gradient was left from another window."""

    def __init__(self, owner: GradientFreeze) -> None:
        self.owner = owner

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        o = self.owner
        if o._current <= 0:
            return
        train = o._set_ids[o._current]
        for p in o._params:
            if id(p) not in train and p.grad is not None:
                p.grad = None


class _FreezeStepPost:
    def __init__(self, owner: GradientFreeze) -> None:
        self.owner = owner

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.owner.position += 1
