"""What Lightning iterates during ``online_train``: the user's stream, with cursors tracked.

:class:`OnlineStream` pulls one batch at a time and queues the source's cursor read right
after it; the loop commits a cursor only once its batch is trained. Its huge ``len()`` turns
off Lightning's one-batch prefetch, which on a tailing stream would hold the newest batch back
and read the cursor one batch ahead. Under DDP the ranks agree before each step (one
all-reduce) on how many have a batch: a rank whose part ran dry steps on a zero-weight filler
while another still has data, and the loop scales the real ranks' loss by
``world / ranks_with_data``, so the update is the mean over the real batches only.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

__all__ = ["OnlineStream", "STREAM_LEN", "cursor_source"]

log = logging.getLogger(__name__)

# The length reported to Lightning: never reached (2**52 steps), and small enough that the
# sum over ranks Lightning computes stays inside int64.
STREAM_LEN = 2**52


def cursor_source(dataset: Any) -> Any:
    """The object whose ``state_dict()`` is the stream cursor, or None.

    A stream source itself; or the dataset of a single-process DataLoader over one (with
    worker processes the cursor lives in the workers and cannot be read).
    """
    if isinstance(dataset, torch.utils.data.DataLoader):
        inner = dataset.dataset
        if _stateful(inner):
            if dataset.num_workers > 0:
                log.warning(
                    "online_train: the DataLoader has num_workers=%d, so the stream cursor of "
                    "%s lives in the workers and is not checkpointed; pass the source itself "
                    "(or num_workers=0) for at-least-once delivery across restarts.",
                    dataset.num_workers,
                    type(inner).__name__,
                )
                return None
            return inner
        return None
    return dataset if _stateful(dataset) else None


def _stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def batch_size_of(batch: Any) -> int:
    """Records in a batch: the first dimension of its label (or of its first tensor)."""
    if isinstance(batch, (tuple, list)) and len(batch) >= 2 and torch.is_tensor(batch[-1]):
        t = batch[-1]
        return int(t.shape[0]) if t.dim() else 1
    stack: list[Any] = [batch]
    while stack:
        x = stack.pop(0)
        if torch.is_tensor(x):
            return int(x.shape[0]) if x.dim() else 1
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (tuple, list)):
            stack.extend(x)
    return 1


class OnlineStream:
    """The user's dataset as one long Lightning "epoch", one batch per ``next``.

    Args:
        dataset: the user's iterable of batches (iterated lazily, on the first ``next``).
        source: the object holding the cursor (see :func:`cursor_source`), or None.
    """

    def __init__(self, dataset: Iterable, source: Any) -> None:
        self.dataset = dataset
        self.source = source
        self._it: Iterator | None = None
        self._pending: deque[tuple[Any, Any]] = deque()  # pulled, not yet yielded (holdout)
        self._cursors: deque[Any] = deque()  # yielded, not yet trained
        self.exhausted = False  # the dataset ended
        self.agreed_stop = False  # ranks agreed to stop (another rank had no batch)
        self.stop_local: Callable[[], bool] = lambda: False
        # DDP: (has a batch, can step, needs a filler template) of this rank ->
        # (ranks with a batch, all can step, some rank needs a template)
        self.agree: Callable[[bool, bool, bool], tuple[int, bool, bool]] | None = None
        # DDP: every rank's object, indexed by rank (shares a filler template)
        self.gather: Callable[[Any], list[Any]] | None = None
        self.can_fill = False  # a dry rank may step on a zero-weight filler (see __next__)
        self.filling = False  # the batch just yielded is a filler
        self.real_ranks = 1  # ranks that step on a real batch this step (DDP)
        self._last: Any = None  # the last real batch yielded (or another rank's, as template)

    def __len__(self) -> int:
        return STREAM_LEN

    def __iter__(self) -> OnlineStream:
        return self

    def _pull(self) -> tuple[Any, Any] | None:
        if self.exhausted:
            return None
        if self._it is None:
            self._it = iter(self.dataset)
        try:
            batch = next(self._it)
        except StopIteration:
            self.exhausted = True
            return None
        cursor = self.source.state_dict() if self.source is not None else None
        return batch, cursor

    def __next__(self) -> Any:
        item = None
        if not self.stop_local():
            item = self._pending.popleft() if self._pending else self._pull()
        self.filling = False
        if self.agree is not None:
            has = item is not None
            needs = self.can_fill and not has and self._last is None
            having, all_can, some_need = self.agree(has, has or self.can_fill, needs)
            self.real_ranks = having
            if having and all_can and some_need and self.gather is not None:
                # a rank that never had a batch fills with the structure of another's
                shared = self.gather(item[0] if has else self._last)
                if self._last is None:
                    self._last = next(b for b in shared if b is not None)
            if having and all_can and not has:
                # this rank ran dry while another still has data: step on a zero-weight
                # filler (the loop zeroes its loss), so the others' records get trained
                item = (self._last, self.source.state_dict() if self.source else None)
                self.filling = True
            elif not (having and all_can):
                if has:
                    # another rank cannot step: this batch is not trained now; its cursor is
                    # not committed, so a restart reads it again
                    self.agreed_stop = True
                item = None
        if item is None:
            raise StopIteration
        if not self.filling:
            self._last = item[0]
        self._cursors.append(item[1])
        return item[0]

    def commit(self) -> Any:
        """The cursor of the batch just trained (the oldest yielded one)."""
        return self._cursors.popleft() if self._cursors else None

    def holdout(self, n: int) -> list[Any]:
        """Pull the next ``n`` batches for evaluation; they are trained right after."""
        out = []
        while len(out) < n and not self.stop_local():
            item = self._pull()
            if item is None:
                break
            self._pending.append(item)
            out.append(item[0])
        return out

    def close(self) -> None:
        """Close the dataset's iterator (ends a generator source cleanly)."""
        it, self._it = self._it, None
        close = getattr(it, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # closing must not mask how training ended
                log.debug("closing the stream iterator failed", exc_info=True)
