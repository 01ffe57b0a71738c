"""Datasets as ``Model`` sees them: size checks, batch checks and dataset-sink streams.

A dataset is a ``torch.utils.data.DataLoader`` or any re-iterable yielding ``(data, label)``
tuples (n-tuples when ``loss_fn`` is None). Its size is ``len()`` when defined.

Sink mode (spec §1.4): with ``sink_size > 0`` an epoch is exactly ``sink_size`` batches taken
from one continuous stream that carries over between epochs; epoch k trains on stream batches
``[(k-1)*sink_size, k*sink_size)``, wrapping across dataset boundaries. :class:`SinkStream` is
that stream, shaped for Lightning: one "batch" per epoch holding the ``sink_size`` batches of
the sink, so the whole sink runs as one tight inner loop inside one Lightning step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

__all__ = [
    "dataset_size",
    "check_dataset",
    "as_batch_tuple",
    "SinkStream",
    "pin_batch",
    "ReIterable",
    "for_lightning",
]


def dataset_size(dataset: Any) -> int | None:
    """Number of batches per pass (``len()``), or None for an unbounded / unsized iterable."""
    try:
        return len(dataset)
    except TypeError:
        return None


def check_dataset(
    dataset: Any, name: str, *, sink: bool = False, sink_size: int = -1
) -> int | None:
    """Validate a dataset argument and return its size (None when unsized).

    Raises:
        TypeError: ``dataset`` is not iterable.
        ValueError: it is empty, or unsized without a positive ``sink_size`` in sink mode.
    """
    if dataset is None or not isinstance(dataset, Iterable):
        raise TypeError(
            f"'{name}' must be a torch DataLoader or a re-iterable of batches, "
            f"but got {type(dataset).__name__}."
        )
    size = dataset_size(dataset)
    if size == 0:
        raise ValueError(
            f"'{name}' is empty: its size (len) is 0; it must yield at least one batch."
        )
    if size is None and not (sink and sink_size > 0):
        raise ValueError(
            f"'{name}' has no length (an unbounded iterable): use dataset_sink_mode=True with "
            f"sink_size > 0 (an epoch is then sink_size batches), got dataset_sink_mode={sink}, "
            f"sink_size={sink_size}."
        )
    return size


def as_batch_tuple(batch: Any, *, expect_pair: bool) -> tuple:
    """Turn one batch into the tuple of positional inputs of the network.

    Raises:
        ValueError: ``expect_pair`` (a loss_fn is set) and the batch is not ``(data, label)``.
    """
    if isinstance(batch, (tuple, list)):
        tup = tuple(batch)
    elif isinstance(batch, dict):
        tup = tuple(batch.values())
    else:
        tup = (batch,)
    if expect_pair and len(tup) != 2:
        raise ValueError(
            "When 'loss_fn' is set, each batch must be a (data, label) pair, but a batch with "
            f"{len(tup)} element(s) was received."
        )
    return tup


def pin_batch(batch: Any) -> Any:
    """Pin the CPU tensors of a (nested) batch so that host-to-CUDA copies can be asynchronous."""
    if torch.is_tensor(batch):
        return batch.pin_memory() if batch.device.type == "cpu" else batch
    if isinstance(batch, (list, tuple)):
        return type(batch)(pin_batch(b) for b in batch)
    if isinstance(batch, dict):
        return {k: pin_batch(v) for k, v in batch.items()}
    return batch


class ReIterable:
    """Wraps a user dataset so that Lightning sees ONE iterable of batches.

    Lightning reads a list, tuple or dict passed as ``train_dataloaders`` as a *collection of
    dataloaders*; a MindSpore-style dataset may well be a plain list of batches.

    Example:
        >>> list(ReIterable([(1, 2), (3, 4)]))
        [(1, 2), (3, 4)]
    """

    def __init__(self, dataset: Iterable) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator:
        return iter(self.dataset)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]


def for_lightning(dataset: Any) -> Any:
    """``dataset`` as Lightning should receive it (DataLoaders pass through unchanged)."""
    if isinstance(dataset, torch.utils.data.DataLoader) or dataset is None:
        return dataset
    return ReIterable(dataset)


class SinkStream:
    """An iterable of sinks: each ``iter()`` yields ONE list of ``sink_size`` consecutive batches.

    The underlying dataset is iterated as one endless stream (re-iterated when a pass ends),
    and the position carries over between epochs. ``len()`` is 1, so Lightning runs exactly
    one step (the whole sink) per epoch.

    Args:
        dataset: the dataset (re-iterable; may be unbounded).
        sink_size: batches per sink (> 0).
        rank, world_size: data-parallel sharding of the stream (batch i goes to rank
            ``i % world_size``) when the dataset is not already sharded.
        pin_memory: pin batches for asynchronous host-to-device copies (CUDA).

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
    ) -> None:
        if sink_size <= 0:
            raise ValueError(f"SinkStream: 'sink_size' must be > 0, but got {sink_size}.")
        self.dataset = dataset
        self.sink_size = sink_size
        self.rank = rank
        self.world_size = world_size
        self.pin_memory = pin_memory
        self._it: Iterator | None = None
        self.batches_consumed = 0  # stream position, in batches of this rank

    def __len__(self) -> int:
        return 1

    def _next_raw(self) -> Any:
        for attempt in range(2):
            if self._it is None:
                self._it = iter(self.dataset)
            try:
                return next(self._it)
            except StopIteration:
                self._it = None
                if attempt == 1:
                    break
        raise ValueError("The training dataset yielded no batch: it must not be empty.")

    def _next_batch(self) -> Any:
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
        """The next ``sink_size`` batches of the stream."""
        return [self._next_batch() for _ in range(self.sink_size)]

    def __iter__(self) -> Iterator[list]:
        yield self.next_sink()
