"""What ``Model`` accepts as a dataset and as a batch, checked before any training starts.

A dataset is a ``torch.utils.data.DataLoader`` or any re-iterable yielding ``(data, label)``
tuples (n-tuples when ``loss_fn`` is None); its size is ``len()`` when defined, and an unsized
one needs sink mode with ``sink_size > 0``. A batch becomes the network's positional inputs
(:func:`as_batch_tuple`). :class:`ReIterable` hands Lightning a plain list of batches as ONE
iterable (Lightning would read a list as several dataloaders). The rank placement
(:mod:`lit_amp.model.rank_placement`) and the sink streams (:mod:`lit_amp.model.sink_stream`)
build on these.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

__all__ = ["dataset_size", "check_dataset", "as_batch_tuple", "ReIterable", "for_lightning"]


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
    if dataset is None or not isinstance(dataset, Iterable) or isinstance(
        dataset, (str, bytes, dict)
    ):
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
        return len(self.dataset)


def for_lightning(dataset: Any) -> Any:
    """``dataset`` as Lightning should receive it (DataLoaders pass through unchanged)."""
    if isinstance(dataset, torch.utils.data.DataLoader) or dataset is None:
        return dataset
    return ReIterable(dataset)
