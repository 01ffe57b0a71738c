"""Which rows of a network's state changed since the last look: what a delta publish writes.

:class:`TouchedRows` hooks the optimizers' ``step`` (a pre-hook: it sees the gradients after
DDP's all-reduce and after the non-finite guard). A parameter with a sparse gradient stepped
by a row-local optimizer (:class:`~lit_amp.rec.optim.LazyAdam`, ``SparseAdam``, ``Adagrad``,
``SGD`` without momentum) has those rows marked in a per-parameter bitmap; any other parameter
with a gradient is marked whole; one without a gradient did not change. Buffers are marked
whole at every look, except those of modules that declare ``row_state`` / ``train_state`` /
``take_changed_rows()`` (e.g. :class:`~lit_amp.rec.modules.id_embedding.IdEmbedding`).

Example:
    >>> emb = torch.nn.Embedding(1000, 4, sparse=True)
    >>> opt = torch.optim.SparseAdam(emb.parameters())
    >>> touched = TouchedRows(emb)
    >>> touched.attach(opt)
    >>> touched.take()  # the first look: everything
    {'weight': None}
    >>> emb(torch.tensor([3, 7, 3])).sum().backward(); opt.step()
    >>> touched.take()
    {'weight': tensor([3, 7])}
    >>> touched.take()
    {}
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from lit_amp._pages import zeroed
from lit_amp.rec.optim import LazyAdam

__all__ = ["MarkedRows", "TouchedRows"]

log = logging.getLogger(__name__)

#: optimizers that change only the rows present in a sparse gradient
_ROW_LOCAL = (LazyAdam, torch.optim.SparseAdam, torch.optim.Adagrad)


def _row_local(optimizer: Any, group: dict) -> bool:
    """Whether ``optimizer`` moves only the rows of a sparse gradient in ``group``."""
    if isinstance(optimizer, _ROW_LOCAL):
        return True
    return isinstance(optimizer, torch.optim.SGD) and not group.get("momentum") and \
        not group.get("weight_decay")


def step_rows(optimizer: Any, group: dict, p: torch.Tensor) -> torch.Tensor | None:
    """The rows of ``p`` (which has a gradient) that this step of ``optimizer`` changes: its
    sparse gradient's rows (uncoalesced: a row may repeat) under a row-local optimizer; None:
    any row (a dense gradient, or an optimizer whose momentum moves rows the gradient does not
    name)."""
    g = p.grad
    if g.is_sparse and g.sparse_dim() == 1 and _row_local(optimizer, group):
        return g._indices()[0]
    return None


class MarkedRows:
    """The rows marked in a bitmap that :meth:`TouchedRows.take` (``lazy=True``) took: counted
    then, listed when :meth:`rows` is first called (the bitmap is no longer written).

    Listing the rows of a 26 M-row bitmap takes ~11 ms with numpy (which holds the GIL) and
    ~30 ms with ``torch.nonzero`` (which releases it): a background writer lists them with
    torch on another core, and the training loop only counts them (~1 ms). Once listed, the
    bitmap is cleared there too and handed to ``recycle``: the loop's next take marks into it
    instead of a new map, whose first marking would fault in every page of it (~21 ms at
    26 M rows, in the loop; docs/benchmarks.md).
    """

    __slots__ = ("bitmap", "count", "_recycle", "_rows")

    def __init__(self, bitmap: torch.Tensor, count: int,
                 recycle: Callable[[torch.Tensor], None] | None = None) -> None:
        self.bitmap: torch.Tensor | None = bitmap
        self.count = count
        self._recycle = recycle
        self._rows: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.count

    def numel(self) -> int:
        """How many rows (as a tensor of them would say)."""
        return self.count

    def rows(self) -> torch.Tensor:
        """The marked rows, sorted (int64)."""
        if self._rows is None:
            bitmap = self.bitmap
            self._rows = bitmap.nonzero().squeeze(1)
            self.bitmap = None  # from here on it belongs to whoever marks into it next
            if self._recycle is not None:
                bitmap.zero_()
                self._recycle(bitmap)
        return self._rows


class TouchedRows:
    """The rows of ``network.state_dict()`` changed since the last :meth:`take`.

    Args:
        network: the module whose state is tracked.

    The first :meth:`take` reports everything (nothing was published before).
    """

    def __init__(self, network: torch.nn.Module) -> None:
        self.network = network
        state = network.state_dict(keep_vars=True)
        self._keys_of: dict[int, list[str]] = {}  # id(parameter) -> its state_dict keys
        params = {id(p) for p in network.parameters()}
        for key, t in state.items():
            if id(t) in params:
                self._keys_of.setdefault(id(t), []).append(key)
        self._buffers = [k for k, t in state.items() if id(t) not in params]
        self._rows_of: dict[str, torch.Tensor] = {}  # key -> bool bitmap of changed rows
        # key -> a cleared bitmap handed back by a listed MarkedRows (another thread sets it)
        self._spare: dict[str, torch.Tensor] = {}
        self._whole: set[str] = set(state)  # keys changed as a whole
        self._modules: list[tuple[str, Any]] = []  # (prefix, module) declaring row_state
        skip: set[str] = set()
        for prefix, m in network.named_modules():
            if callable(getattr(m, "take_changed_rows", None)):
                p = f"{prefix}." if prefix else ""
                self._modules.append((p, m))
                skip.update(p + n for n in (*m.row_state, *m.train_state))
        self._buffers = [k for k in self._buffers if k not in skip]
        self._train_state = {p + n for p, m in self._modules for n in m.train_state}
        self._handles: list[Any] = []
        self._warned: set[str] = set()

    @property
    def row_modules(self) -> list[torch.nn.Module]:
        """The modules that change rows themselves, outside optimizer steps
        (``take_changed_rows``)."""
        return [m for _, m in self._modules]

    @property
    def train_state(self) -> set[str]:
        """Keys never published in a delta (a module's training statistics)."""
        return set(self._train_state)

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Track the parameters ``optimizer`` steps (every optimizer that changes the network
        must be attached)."""
        self._handles.append(optimizer.register_step_pre_hook(self._pre_step))

    def detach(self) -> None:
        """Unhook the optimizers."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def mark_all(self) -> None:
        """Everything changed (the next :meth:`take` reports the whole state)."""
        self._whole.update(self.network.state_dict(keep_vars=True))

    def mark(self, changes: dict[str, torch.Tensor | None]) -> None:
        """Mark ``changes`` (what :meth:`take` returned) again, e.g. after a failed write."""
        for key, rows in changes.items():
            if rows is None:
                self._whole.add(key)
            else:
                self._mark_rows(key, rows.rows() if isinstance(rows, MarkedRows) else rows)

    def _mark_rows(self, key: str, rows: torch.Tensor, length: int | None = None) -> None:
        bitmap = self._rows_of.get(key)
        if bitmap is None:
            if length is None:
                length = self.network.state_dict(keep_vars=True)[key].shape[0]
            bitmap = self._rows_of[key] = torch.zeros(length, dtype=torch.bool)
        bitmap.index_fill_(0, rows.to("cpu", torch.long), True)

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                keys = self._keys_of.get(id(p))
                if p.grad is None or not keys:
                    continue
                rows = step_rows(optimizer, group, p)
                if rows is not None:
                    for key in keys:
                        self._mark_rows(key, rows, p.shape[0])
                else:
                    if p.grad.is_sparse:
                        self._warn_whole(keys[0], optimizer)
                    self._whole.update(keys)

    def _warn_whole(self, key: str, optimizer: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(
                "delta publishing: %s may move rows of %r that its sparse gradient does not "
                "name (momentum or weight decay), so every delta holds the whole tensor; use "
                "LazyAdam, SparseAdam, Adagrad or SGD without momentum for row deltas.",
                type(optimizer).__name__, key,
            )

    def take(self, lazy: bool = False) -> dict[str, torch.Tensor | MarkedRows | None]:
        """The changes since the last call, then forget them.

        Args:
            lazy: report a row-tracked key's rows as :class:`MarkedRows` (counted now, listed
                later, e.g. by a writer thread) instead of a tensor of them.

        Returns:
            ``{state_dict key: sorted changed rows (int64)}``, or ``None`` for a key changed
            as a whole; unchanged keys are absent. Buffers are always reported whole, training
            statistics (:attr:`train_state`) never (but when everything is marked).
        """
        for prefix, m in self._modules:
            rows = m.take_changed_rows()
            if rows.numel():
                for name in m.row_state:
                    self._mark_rows(prefix + name, rows)
        out: dict[str, torch.Tensor | MarkedRows | None] = {}
        for key, bitmap in self._rows_of.items():
            if lazy:
                count = int(np.count_nonzero(bitmap.numpy()))
                if count:  # handed over whole: marking goes on in a cleared bitmap
                    out[key] = MarkedRows(bitmap, count, partial(self._spare.__setitem__, key))
                    spare = self._spare.pop(key, None)
                    self._rows_of[key] = spare if spare is not None else \
                        zeroed(len(bitmap), torch.bool)
                continue
            # numpy's flatnonzero: 2.5 x faster than torch's nonzero on a 26 M-row bitmap
            rows = torch.from_numpy(np.flatnonzero(bitmap.numpy()))
            if rows.numel():
                out[key] = rows
                bitmap.zero_()
        for key in (*self._whole, *self._buffers):
            out[key] = None
        self._whole = set()
        return out
