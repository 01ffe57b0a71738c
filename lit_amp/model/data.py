"""Datasets as ``Model`` sees them: size checks, batch checks and dataset-sink streams.

A dataset is a ``torch.utils.data.DataLoader`` or any re-iterable yielding ``(data, label)``
tuples (n-tuples when ``loss_fn`` is None). Its size is ``len()`` when defined.

Sink mode (docs/semantics.md §1.4): with ``sink_size > 0`` an epoch is exactly ``sink_size`` batches
from one continuous stream that carries over between epochs; epoch k trains on stream batches
``[(k-1)*sink_size, k*sink_size)``, wrapping across dataset boundaries. :class:`SinkStream` is
that stream, shaped for Lightning: one "batch" per epoch holding the ``sink_size`` batches of
the sink, so the whole sink runs as one tight inner loop inside one Lightning step.

Under data parallelism every dataset is given to the ranks by one rule
(:func:`rank_source`): a DataLoader whose sampler already picks this rank's part (a
``DistributedSampler``, or any sampler / batch sampler with ``num_replicas`` and ``rank``) is
used as it is; another DataLoader is split by its sampler; a list or other re-iterable gives
rank r every ``world``-th batch; an ``IterableDataset`` is refused unless wrapped in
:class:`PerRank` (it yields this rank's part) or :class:`SplitByRank` (split its batches).
Evaluation drops the samples a ``DistributedSampler`` repeats to pad ranks
(:func:`padding_trim`), so every sample is counted once. Splitting one order by batch index
needs every rank to iterate the same order: an evaluation pass compares a digest of its first
batch (its sample indices, or its content for a re-iterable) across the ranks and refuses a
difference (:func:`check_same_order`; a ``shuffle=True`` loader seeded per rank). Only the
first batch is compared: orders that agree on it and part later are not detected.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from lightning.pytorch import Callback
from lightning_utilities.core.apply_func import apply_to_collection

__all__ = [
    "dataset_size",
    "check_dataset",
    "as_batch_tuple",
    "SinkStream",
    "Sink",
    "RankShard",
    "NO_BATCH",
    "placement_of",
    "rank_data",
    "shard_loader",
    "pin_batch",
    "ReIterable",
    "for_lightning",
    "PerRank",
    "SplitByRank",
    "rank_source",
    "padding_trim",
    "PaddingTrim",
    "batch_digest",
    "check_same_order",
    "SinkSizeOfRank",
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


def pin_batch(batch: Any) -> Any:
    """Pin the CPU tensors of a (nested) batch so that host-to-CUDA copies can be asynchronous."""
    return apply_to_collection(
        batch, torch.Tensor, lambda t: t.pin_memory() if t.device.type == "cpu" else t)


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


class PerRank(ReIterable):
    """Declares that ``dataset`` already yields only this rank's part: used as it is.

    For data that shards itself by rank (an ``IterableDataset`` reading
    ``torch.distributed.get_rank()``, Hugging Face's ``split_dataset_by_node``, MindSpore's
    ``num_shards``/``shard_id`` habit) or any per-rank data. In training every rank must
    yield as many batches per pass (a rank that ends first leaves the others waiting at the
    gradient all-reduce).

    Example:
        >>> list(RankShard(PerRank([1, 2, 3]), lambda: (1, 2), train=False))
        [1, 2, 3]
    """


class SplitByRank(ReIterable):
    """Declares that ``dataset`` yields the same batches on every rank: rank r keeps the
    batches ``r, r + world, ...`` (every rank reads the whole stream), as for a list.

    Example:
        >>> list(RankShard(SplitByRank([1, 2, 3]), lambda: (1, 2), train=False))
        [2]
    """


def for_lightning(dataset: Any) -> Any:
    """``dataset`` as Lightning should receive it (DataLoaders pass through unchanged)."""
    if isinstance(dataset, torch.utils.data.DataLoader) or dataset is None:
        return dataset
    return ReIterable(dataset)


def placement_of(module: Any) -> tuple[int, int]:
    """``(rank, world_size)`` of the data-parallel group ``module``'s Trainer splits data over.

    Read from the strategy's ``distributed_sampler_kwargs`` (what Lightning's own
    ``DistributedSampler`` uses), so tensor-parallel peers get the same data; ``(0, 1)`` when
    ``module`` is not attached to a distributed Trainer.

    Example:
        >>> placement_of(None)
        (0, 1)
    """
    trainer = getattr(module, "_trainer", None)
    kw = getattr(trainer, "distributed_sampler_kwargs", None) if trainer is not None else None
    if not kw:
        return 0, 1
    return int(kw.get("rank", 0)), int(kw.get("num_replicas", 1))


def batch_digest(batch: Any) -> int:
    """A digest of ``batch`` that is equal on every process for equal batches (a signed int64).

    Tensors count by dtype, shape and up to 64 leading values of each sample (so a reordering
    inside the batch shows too, at a bounded cost); other values by their ``repr``.

    Example:
        >>> batch_digest([0, 1, 2]) == batch_digest([0, 1, 2]) != batch_digest([0, 2, 1])
        True
    """
    h = hashlib.blake2b(digest_size=8)

    def feed(item: Any) -> None:
        if torch.is_tensor(item):
            t = item.detach()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            if t.dim() > 1:
                t = t.reshape(t.shape[0], -1)[:, :64]
            h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(item, (list, tuple)):
            h.update(f"{type(item).__name__}{len(item)}".encode())
            for x in item:
                feed(x)
        elif isinstance(item, dict):
            for k, x in item.items():
                h.update(repr(k).encode())
                feed(x)
        else:
            h.update(repr(item).encode())

    feed(batch)
    return int.from_bytes(h.digest(), "little", signed=True)


def check_same_order(digest: int, what: str) -> None:
    """Refuse evaluation data that each rank iterates in another order (a collective).

    lit_amp gives rank r the batches ``r, r + world, ...`` of the evaluation data; that counts
    every sample once only when every rank iterates the same order. ``digest`` (of the first
    batch, :func:`batch_digest`) is gathered from every rank of the default process group and
    compared; every rank calls it at its first batch. Nothing happens without a group.

    Args:
        digest: this rank's digest of the first batch.
        what: the data, for the message.

    Raises:
        RuntimeError: the digests differ (on every rank alike, so none waits).

    Example:
        >>> check_same_order(batch_digest([0, 1]), "valid_dataset")  # one process: nothing
    """
    import torch.distributed as dist

    from lit_amp._runtime import dist_ready

    if not dist_ready() or dist.get_world_size() == 1:
        return
    backend = str(dist.get_backend())
    device = (torch.device("cuda", torch.cuda.current_device())
              if "nccl" in backend and "gloo" not in backend else torch.device("cpu"))
    mine = torch.tensor([digest], dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    if len({int(t) for t in every}) > 1:
        raise RuntimeError(
            f"The evaluation data '{what}' is iterated in a different order on each rank (its "
            "first batch differs between the ranks: a shuffle seeded per rank, e.g. "
            "DataLoader(shuffle=True) with a generator of seed + rank). lit_amp gives each rank "
            "every world_size-th batch of one order, so samples would be counted twice or "
            "never. Evaluate with shuffle=False, or the same seed on every rank, or give a "
            "DataLoader with a DistributedSampler (each rank's own part)."
        )


class _EveryNthBatch:
    """The batches ``rank, rank + world, ...`` of a batch sampler (unrepeated, unpadded).

    ``check``: the name of the data; then the first batch's indices are compared across the
    ranks (:func:`check_same_order`), at every pass.
    """

    def __init__(self, batch_sampler: Iterable, rank: int, world: int,
                 check: str | None = None) -> None:
        self.batch_sampler, self.rank, self.world = batch_sampler, rank, world
        self.check = check

    def __iter__(self) -> Iterator:
        for i, batch in enumerate(self.batch_sampler):
            if i == 0 and self.check is not None:
                check_same_order(batch_digest(batch), self.check)
            if i % self.world == self.rank:
                yield batch

    def __len__(self) -> int:
        return len(range(self.rank, len(self.batch_sampler), self.world))


_LOADER_ARGS = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
                "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers",
                "pin_memory_device", "in_order")


def _rank_aware(loader: Any) -> Any:
    """The loader's sampler or batch sampler that already picks a rank's part, or None."""
    from torch.utils.data import DistributedSampler

    bs = getattr(loader, "batch_sampler", None)
    for s in (getattr(loader, "sampler", None), bs, getattr(bs, "sampler", None)):
        if isinstance(s, DistributedSampler) or (hasattr(s, "num_replicas")
                                                 and hasattr(s, "rank")):
            return s
    return None


def _refuse_stream(dataset: Any, name: str, world: int) -> ValueError:
    what = "a DataLoader over" if isinstance(dataset, torch.utils.data.DataLoader) else "an"
    inner = getattr(dataset, "dataset", dataset)
    return ValueError(
        f"The argument '{name}' is {what} IterableDataset ({type(inner).__name__}), which "
        f"lit_amp cannot split over the {world} data-parallel ranks by itself: it has no "
        "sampler, and whether each rank's copy already yields only that rank's part cannot be "
        "told. Say which: lit_amp.model.data.PerRank(dataset) when each rank's copy yields its "
        "own part (it shards itself by rank; used as it is), or "
        "lit_amp.model.data.SplitByRank(dataset) when every rank's copy yields the same stream "
        f"(rank r then keeps the batches r, r + {world}, ...)."
    )


def rank_source(dataset: Any, rank: int, world: int, *, train: bool,
                name: str = "train_dataset") -> tuple[Any, int, int]:
    """What this rank iterates: ``(source, r, w)``, the batches ``r, r + w, ...`` of ``source``.

    ``(loader, 0, 1)`` (all of it) for a DataLoader that already picks this rank's part (its
    sampler or batch sampler is a ``DistributedSampler`` or has ``num_replicas`` and ``rank``)
    or one rebuilt with this rank's sampler (:func:`shard_loader`), and for :class:`PerRank`;
    ``(dataset, rank, world)`` for a list, any other re-iterable and :class:`SplitByRank`.

    Raises:
        ValueError: an ``IterableDataset`` (in a DataLoader or not) under ``world > 1``,
            unless wrapped in :class:`PerRank` or :class:`SplitByRank`; a rank-aware
            sampler made for another ``(rank, world)``.

    Example:
        >>> rank_source([1, 2, 3], 1, 2, train=True)
        ([1, 2, 3], 1, 2)
    """
    from torch.utils.data import DataLoader, IterableDataset

    if world == 1 or isinstance(dataset, PerRank):
        return dataset, 0, 1
    if isinstance(dataset, SplitByRank):
        return dataset, rank, world
    if isinstance(getattr(dataset, "dataset", None) if isinstance(dataset, DataLoader)
                  else dataset, IterableDataset):
        raise _refuse_stream(dataset, name, world)
    if isinstance(dataset, DataLoader):
        own = _rank_aware(dataset)
        if own is not None:
            got = (getattr(own, "rank", rank), getattr(own, "num_replicas", world))
            if got != (rank, world):
                raise ValueError(
                    f"The argument '{name}' has a {type(own).__name__} that splits the data "
                    f"for num_replicas={got[1]}, rank={got[0]}, but this process is rank "
                    f"{rank} of {world} ranks: build it with num_replicas={world}, "
                    f"rank={rank}, or give a plain sampler and let lit_amp split the data."
                )
            return dataset, 0, 1
        loader = shard_loader(dataset, rank, world, train=train, name=name)
        if loader is not None:
            return loader, 0, 1
    return dataset, rank, world


def shard_loader(loader: Any, rank: int, world_size: int, *, train: bool,
                 name: str | None = None) -> Any:
    """``loader`` rebuilt for this rank, or None when it cannot be (an iterable dataset, a
    sampler that already picks a rank's part...).

    ``train=True``: the split Lightning's ``DistributedSampler`` gives (padded, so every rank
    has the same number of batches; shuffled, as Lightning shuffles every distributed training
    loader). ``train=False``: the
    loader's own batches ``rank, rank + world_size, ...``: every batch on exactly one rank,
    batched as in one process, so batch-averaged values (the loss) come out the same; each
    pass compares the first batch's indices across the ranks (:func:`check_same_order`,
    ``name`` the argument named in its error).
    """
    from lightning.pytorch.trainer.connectors.data_connector import _get_distributed_sampler
    from lightning.pytorch.trainer.states import RunningStage
    from lightning.pytorch.utilities.data import _update_dataloader
    from torch.utils.data import DataLoader, IterableDataset

    if isinstance(loader.dataset, IterableDataset) or _rank_aware(loader) is not None:
        return None
    if not train:
        if type(loader) is not DataLoader or loader.batch_sampler is None:
            return None  # a subclass may take other arguments: RankShard skips batches
        kw = {k: getattr(loader, k) for k in _LOADER_ARGS if hasattr(loader, k)}
        if not kw.get("num_workers"):
            kw.pop("prefetch_factor", None)
            kw.pop("persistent_workers", None)
        every_nth = _EveryNthBatch(loader.batch_sampler, rank, world_size,
                                   check=name or "valid_dataset")
        return DataLoader(loader.dataset, batch_sampler=every_nth, **kw)
    stage = RunningStage.TRAINING
    # shuffle=True: Lightning shuffles every training loader it distributes, a sequential one
    # too (data_connector._process_dataloader), so sink and non-sink runs split alike
    sampler = _get_distributed_sampler(loader, True, overfit_batches=0,
                                       mode=stage, num_replicas=world_size, rank=rank)
    return _update_dataloader(loader, sampler, mode=stage)


class NoBatch:
    """What a rank evaluates when the evaluation set has fewer batches than ranks.

    Lightning refuses a rank with no batch while others have some; this rank then runs one
    step on ``NO_BATCH``, which ``LitModel`` skips (no metric update), so every sample is
    still counted once.
    """

    def __repr__(self) -> str:
        return "NO_BATCH"


#: the one :class:`NoBatch`
NO_BATCH = NoBatch()


class RankShard:
    """This rank's part of a dataset under data parallelism, decided when iterated.

    ``placement()`` gives ``(rank, world_size)`` (see :func:`placement_of`); the rule is
    :func:`rank_source`'s (``name``, the argument, is named in its errors). A DataLoader is
    rebuilt with this rank's sampler (:func:`shard_loader`) unless its sampler already picks
    this rank's part; any other iterable gives this
    rank every ``world_size``-th batch. ``train=True``: every rank gets the same number of
    batches (a short rank's part wraps around, as ``DistributedSampler`` pads), so no rank
    waits at a collective the others never reach. ``train=False``: every batch goes to exactly
    one rank (exact evaluation; the counts may differ by one), which needs every rank to
    iterate the same order: the first batch is compared across the ranks
    (:func:`check_same_order`).

    Example:
        >>> list(RankShard([1, 2, 3], lambda: (1, 2), train=False))
        [2]
        >>> list(RankShard([1, 2, 3], lambda: (1, 2), train=True))
        [2, 1]
    """

    def __init__(self, dataset: Iterable, placement: Any, *, train: bool,
                 name: str | None = None) -> None:
        self.dataset = dataset
        self.placement = placement
        self.train = train
        self.name = name or ("train_dataset" if train else "valid_dataset")
        self._src: tuple[Any, int, int] = (dataset, 0, 1)
        self._key: tuple[int, int] | None = None
        self._passes = 0

    def _source(self) -> tuple[Any, int, int]:
        rank, world = self.placement()
        if self._key != (rank, world):
            self._src = rank_source(self.dataset, rank, world, train=self.train, name=self.name)
            self._key = (rank, world)
        return self._src

    def __len__(self) -> int:
        src, rank, world = self._source()
        n = len(src)
        if world == 1:
            # an evaluation part with no batch stands in one NO_BATCH step (see NoBatch)
            return n if self.train or n or self.placement()[1] == 1 else 1
        return -(-n // world) if self.train else max(1, len(range(rank, n, world)))

    def __iter__(self) -> Iterator:
        src, rank, world = self._source()
        sampler = getattr(src, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self._passes)  # a fresh shuffle per pass, the same on all ranks
        self._passes += 1
        n = dataset_size(src) or 0
        if world == 1:
            yield from src
            if not (self.train or n or self.placement()[1] == 1):
                yield NO_BATCH
            return
        head: list = []  # round 0, which pads a short last round (as DistributedSampler pads)
        for i, batch in enumerate(src):
            if i == 0 and not self.train:  # every rank must iterate the same order
                check_same_order(batch_digest(batch), self.name)
            if self.train and i < world:
                head.append(batch)
            if i % world == rank:
                yield batch
        if self.train:
            for p in range(n, -(-n // world) * world):
                if p % world == rank:
                    yield head[p - n]
        elif rank >= n:
            yield NO_BATCH  # fewer batches than ranks: this one has none (see NoBatch)


class PaddingTrim:
    """Cuts the samples a ``DistributedSampler`` repeats from this rank's evaluation batches.

    With ``drop_last=False`` the sampler repeats ``total_size - len(dataset)`` samples so that
    every rank gets as many; they come last in the parts of the ranks that get one. Called
    on each batch with its index: the samples past this rank's ``real`` ones are cut from the
    first dimension of every tensor; a batch of repeats only becomes :data:`NO_BATCH`.

    Example:
        >>> trim = PaddingTrim(real=3, num_samples=4, batch_size=2)  # 4th sample repeated
        >>> trim((torch.arange(2), torch.arange(2)), 0)[0].tolist()
        [0, 1]
        >>> trim((torch.tensor([2, 0]), torch.tensor([2, 0])), 1)[0].tolist()
        [2]
    """

    def __init__(self, real: int, num_samples: int, batch_size: int | None) -> None:
        self.real, self.num_samples, self.batch_size = real, num_samples, batch_size

    def __call__(self, batch: Any, batch_idx: int) -> Any:
        if self.batch_size is None:  # no batching: one sample per step
            return batch if batch_idx < self.real else NO_BATCH
        start = batch_idx * self.batch_size
        keep = self.real - start
        size = min(self.batch_size, self.num_samples - start)
        if keep >= size:
            return batch
        return NO_BATCH if keep <= 0 else _head(batch, keep, size, batch_idx)


def _head(batch: Any, keep: int, size: int, batch_idx: int) -> Any:
    """``batch`` with only its first ``keep`` of ``size`` samples (first dimension)."""

    def cut(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0 or t.shape[0] != size:
            raise ValueError(
                f"Evaluation batch {batch_idx} holds {size - keep} sample(s) that the "
                f"DistributedSampler repeated to give every rank as many, which lit_amp cuts "
                f"from the first dimension of each tensor; but a tensor of the batch has shape "
                f"{tuple(t.shape)}, not {size} first. Give the DataLoader a collate_fn "
                "that keeps the samples on the first dimension, or evaluate through "
                "Model.eval a DataLoader with a plain sampler (split by whole batches)."
            )
        return t[:keep]

    return apply_to_collection(batch, torch.Tensor, cut)


def padding_trim(loaders: Any) -> PaddingTrim | None:
    """The :class:`PaddingTrim` of the evaluation loader a Trainer holds, or None.

    None when its sampler repeats nothing (no ``DistributedSampler``, or ``len(dataset)``
    divides evenly). ``loaders`` may be a DataLoader, a one-element list of one, or a
    :class:`RankShard` (the DataLoader it iterates is looked at).

    Raises:
        ValueError: the ``DistributedSampler`` drops samples (``drop_last=True``: they
            would not be counted), or it repeats samples into the batches of a batch
            sampler other than torch's ``BatchSampler`` (which ones cannot be told).

    Example:
        >>> from torch.utils.data import DataLoader, DistributedSampler
        >>> ds = list(range(7))
        >>> dl = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, 2, 1, False))
        >>> trim = padding_trim(dl)
        >>> [trim(b, i) for i, b in enumerate(dl)][-1].tolist()  # sample 0 again: cut
        [5]
    """
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

    if isinstance(loaders, (list, tuple)) and len(loaders) == 1:
        loaders = loaders[0]
    if isinstance(loaders, RankShard):
        loaders = loaders._source()[0]
    if not isinstance(loaders, DataLoader):
        return None
    bs = loaders.batch_sampler
    sampler = (loaders.sampler if isinstance(loaders.sampler, DistributedSampler)
               else getattr(bs, "sampler", None))
    total = getattr(sampler, "total_size", None)
    if not isinstance(sampler, DistributedSampler) or total is None:
        return None
    n = len(sampler.dataset)
    if total < n:
        raise ValueError(
            f"The evaluation DataLoader's {type(sampler).__name__} has drop_last=True: it "
            f"leaves out {n - total} of the {n} samples, which would not be counted. Use "
            "drop_last=False (the samples it repeats to pad the ranks are not counted)."
        )
    if total == n:
        return None
    if bs is not None and type(bs) is not BatchSampler:
        raise ValueError(
            f"The evaluation DataLoader's {type(sampler).__name__} repeats {total - n} of "
            f"{n} samples to give every rank as many, and its batch sampler "
            f"{type(bs).__name__} (not torch's BatchSampler) batches them in a way lit_amp "
            "cannot follow to leave the repeats out. Use a BatchSampler, or a dataset "
            f"length divisible by the {sampler.num_replicas} ranks."
        )
    real = len(range(sampler.rank, n, sampler.num_replicas))
    return PaddingTrim(real, sampler.num_samples, None if bs is None else bs.batch_size)


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


def rank_data(dataset: Any, module: Any, *, train: bool, sink_size: int = 0,
              pin_memory: bool = False, per_pass: bool = False) -> Any:
    """``dataset`` as ``module``'s rank should see it under data parallelism (decided late).

    Sink mode (``sink_size > 0``): a :class:`SinkStream` of this rank's batches (``per_pass``:
    see there). Training: a DataLoader over a map-style dataset goes to Lightning unchanged
    (it gets Lightning's ``DistributedSampler``, or keeps the user's), any other dataset
    becomes a padded :class:`RankShard` (so a rank-aware sampler that is not a
    ``DistributedSampler`` is not split again by Lightning). Evaluation: an unpadded
    :class:`RankShard` (every batch on exactly one rank, counted once).

    Args:
        dataset: the user's dataset, or None.
        module: the LightningModule whose Trainer decides the placement.
        train: training (True) or evaluation data.
        sink_size: steps per sink in sink mode, 0 otherwise.
        pin_memory: pin sink batches (CUDA).
        per_pass: sink mode's ``sink_size`` stands for ``-1`` (one pass of this rank's part).

    Example:
        >>> list(rank_data([1, 2], None, train=False))
        [1, 2]
    """
    if dataset is None:
        return None
    if sink_size:
        return SinkStream(dataset, sink_size, pin_memory=pin_memory, per_pass=per_pass,
                          placement=lambda: placement_of(module))
    if train and isinstance(dataset, torch.utils.data.DataLoader) and not isinstance(
            dataset.dataset, torch.utils.data.IterableDataset):
        own = _rank_aware(dataset)
        if own is None or (own is dataset.sampler
                           and isinstance(own, torch.utils.data.DistributedSampler)):
            return dataset  # Lightning splits it, or leaves the user's DistributedSampler be
    return RankShard(dataset, lambda: placement_of(module), train=train)
