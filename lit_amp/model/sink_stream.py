"""Sink mode's data: one continuous stream of batches, cut into sinks of ``sink_size``.

With ``sink_size > 0`` an epoch is exactly ``sink_size`` batches of one stream that carries
over between epochs (docs/semantics.md §1.4): epoch k trains on stream batches
``[(k-1)*sink_size, k*sink_size)``, wrapping across dataset passes. :class:`SinkStream` is
that stream shaped for Lightning: one "batch" per epoch, a lazy :class:`Sink` whose batches
the whole sink draws in one tight loop inside one Lightning step (on CUDA the next batch is
copied ahead). Under data parallelism each rank streams its own part
(:func:`~lit_amp.model.rank_placement.rank_source`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from lightning.pytorch import Callback
from lightning_utilities.core.apply_func import apply_to_collection

from lit_amp.model.rank_placement import RankShard, rank_source

__all__ = ["SinkStream", "Sink", "SinkSizeOfRank", "pin_batch"]


def pin_batch(batch: Any) -> Any:
    """Pin the CPU tensors of a (nested) batch so that host-to-CUDA copies can be asynchronous."""
    return apply_to_collection(
        batch, torch.Tensor, lambda t: t.pin_memory() if t.device.type == "cpu" else t)


def _leading_dim(batch: Any) -> int:
    """Samples in one batch: the leading size of its first tensor (0 when it has none)."""
    if torch.is_tensor(batch):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)) and batch:
        return _leading_dim(batch[0])
    return 0


class Sink:
    """One sink: ``size`` batches of a :class:`SinkStream`, fetched lazily one at a time.

    Iterating it draws the batches from the stream as the steps need them, so at most two
    batches are held (the current one and, on CUDA, the next, already on its way to the
    device). ``sink[-1]`` is the latest batch drawn (the first one before any step ran),
    what callbacks see as ``train_dataset_element``.

    Example:
        >>> s = SinkStream([(i, i) for i in range(5)], sink_size=2)
        >>> sink = next(iter(s))
        >>> len(sink), [b[0] for b in sink], sink[-1]
        (2, [0, 1], (1, 1))
    """

    def __init__(self, stream: SinkStream, size: int) -> None:
        self._stream = stream
        self._size = size
        self._drawn = 0
        self._pending: Any = None
        self._has_pending = False
        self._last: Any = None
        #: samples in the batches drawn so far (for throughput monitors)
        self.samples = 0

    def __len__(self) -> int:
        return self._size

    def _draw(self) -> Any:
        if self._has_pending:
            self._has_pending = False
            batch, self._pending = self._pending, None
        else:
            batch = self._stream.next_batch()
        self._drawn += 1
        self._last = batch
        self.samples += _leading_dim(batch)
        return batch

    def __getitem__(self, index: int) -> Any:
        if index != -1:
            raise IndexError(f"Sink: only sink[-1] (the latest batch) is kept, got {index}.")
        if self._drawn == 0 and not self._has_pending:
            self._pending, self._has_pending = self._stream.next_batch(), True
        return self._pending if self._drawn == 0 else self._last

    def __iter__(self) -> Iterator:
        while self._drawn < self._size:
            yield self._draw()

    def batches(self, device: torch.device | str | None = None) -> Iterator:
        """The sink's batches, each moved to ``device``; on CUDA the next one is copied ahead.

        Args:
            device: the device of the step (None or CPU: the batches as drawn).
        """
        dev = torch.device(device) if device is not None else None
        if dev is None or dev.type == "cpu":
            yield from self
            return
        from lightning.fabric.utilities.apply_func import move_data_to_device

        it = iter(self)
        nxt = next(it, None)
        nxt = move_data_to_device(nxt, dev)  # non-blocking from pinned memory
        for _ in range(self._size):
            cur = nxt
            if self._drawn < self._size:
                nxt = move_data_to_device(next(it), dev)
            yield cur


class SinkStream:
    """An iterable of sinks: each ``iter()`` yields ONE :class:`Sink` of ``sink_size`` batches.

    The underlying dataset is iterated as one endless stream (re-iterated when a pass ends),
    and the position carries over between epochs. ``len()`` is 1, so Lightning runs exactly
    one step (the whole sink) per epoch. The batches are drawn lazily, one per step.

    Under data parallelism each rank streams its own disjoint part (:func:`rank_source`): a
    DataLoader is rebuilt with the ``DistributedSampler`` split Lightning would give it
    (reshuffled per pass when it shuffles) unless its sampler already picks this rank's
    part; any other iterable gives rank r every ``world_size``-th batch. Every rank runs
    ``sink_size`` steps per epoch, so none waits for another at the end. ``per_pass``
    (``sink_size=-1``): a sink is one pass of this rank's part, as a non-sink epoch (the
    part padded as :class:`RankShard` pads), and ``sink_size`` becomes its length when the
    stream is placed (:meth:`resolve`).

    Args:
        dataset: the dataset (re-iterable; may be unbounded).
        sink_size: batches per sink (> 0).
        rank, world_size: a fixed data-parallel placement (when ``placement`` is None).
        pin_memory: pin batches for asynchronous host-to-device copies (CUDA).
        placement: a callable returning ``(rank, world_size)`` when the stream starts (see
            :func:`placement_of`); it takes precedence over ``rank``/``world_size``.
        per_pass: ``sink_size`` is the dataset's length (``-1`` asked): under data
            parallelism it becomes the length of this rank's part.

    Example:
        >>> s = SinkStream([(i, i) for i in range(5)], sink_size=2)
        >>> [[b[0] for b in sink] for _ in range(3) for sink in s]
        [[0, 1], [2, 3], [4, 0]]
    """

    def __init__(
        self,
        dataset: Iterable,
        sink_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        pin_memory: bool = False,
        placement: Any = None,
        per_pass: bool = False,
    ) -> None:
        if sink_size <= 0:
            raise ValueError(f"SinkStream: 'sink_size' must be > 0, but got {sink_size}.")
        self.dataset = dataset
        self.sink_size = sink_size
        self.rank = rank
        self.world_size = world_size
        self.pin_memory = pin_memory
        self.placement = placement if placement is not None else (lambda: (rank, world_size))
        self.per_pass = per_pass
        self._source: Any = None
        self._it: Iterator | None = None
        self._passes = 0
        self.batches_consumed = 0  # stream position, in batches of this rank

    def __len__(self) -> int:
        return 1

    def _resolve(self) -> None:
        rank, world = self.placement()
        if self.per_pass and world > 1:  # one sink = one (padded) pass of this rank's part
            self._source = RankShard(self.dataset, lambda: (rank, world), train=True)
            self.rank, self.world_size = 0, 1
            self.sink_size = len(self._source)
            return
        self._source, self.rank, self.world_size = rank_source(self.dataset, rank, world,
                                                               train=True)

    def resolve(self) -> int:
        """Place the stream on this rank (once, when the Trainer is set up); its ``sink_size``."""
        if self._source is None:
            self._resolve()
        return self.sink_size

    def _next_raw(self) -> Any:
        if self._source is None:
            self._resolve()
        for attempt in range(2):
            if self._it is None:
                sampler = getattr(self._source, "sampler", None)
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(self._passes)
                self._passes += 1
                self._it = iter(self._source)
            try:
                return next(self._it)
            except StopIteration:
                self._it = None
                if attempt == 1:
                    break
        raise ValueError("The training dataset yielded no batch: it must not be empty.")

    def next_batch(self) -> Any:
        """The next batch of this rank's stream (pinned when ``pin_memory``)."""
        if self._source is None:
            self._resolve()
        if self.world_size > 1:
            # skip the other ranks' batches: this rank takes every world_size-th batch
            for _ in range(self.rank):
                self._next_raw()
            batch = self._next_raw()
            for _ in range(self.world_size - self.rank - 1):
                self._next_raw()
        else:
            batch = self._next_raw()
        self.batches_consumed += 1
        return pin_batch(batch) if self.pin_memory else batch

    def next_sink(self) -> list:
        """The next ``sink_size`` batches of the stream, as a list (drawn now)."""
        return [self.next_batch() for _ in range(self.sink_size)]

    def __iter__(self) -> Iterator[Sink]:
        yield Sink(self, self.resolve())


class SinkSizeOfRank(Callback):
    """At train start, sets ``Model``'s steps per sink to this rank's (``sink_size=-1``).

    Under data parallelism a sink is then one pass of this rank's part, whose length is known
    only once the Trainer has placed the ranks: it becomes ``cb_params.batch_num`` and the
    MindSpore bridge's ``sink_size`` (steps counted per sink). Put it before both.
    """

    def __init__(self, stream: SinkStream, cb_params: Any, bridge: Any) -> None:
        self.stream, self.cb_params, self.bridge = stream, cb_params, bridge

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.cb_params.batch_num = self.bridge.sink_size = self.stream.resolve()
