"""Which batches each data-parallel rank trains on and evaluates, by one rule.

A DataLoader whose sampler already picks this rank's part (a ``DistributedSampler``, or any
sampler with ``num_replicas`` and ``rank``) is used as it is; another DataLoader is split by
its sampler; a list or other re-iterable gives rank r every ``world``-th batch; an
``IterableDataset`` is refused unless wrapped in :class:`PerRank` or :class:`SplitByRank`
(:func:`rank_source`). Evaluation counts every sample once: the repeats a
``DistributedSampler`` pads with are cut (:func:`padding_trim`), a rank without a batch runs
:data:`NO_BATCH`, and the ranks' first batches are compared so that a per-rank shuffle is
refused (:func:`check_same_order`; orders that part after the first batch are not detected).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection

from lit_amp.model.data_checks import ReIterable, dataset_size

__all__ = [
    "PerRank",
    "SplitByRank",
    "placement_of",
    "batch_digest",
    "check_same_order",
    "rank_source",
    "shard_loader",
    "NoBatch",
    "NO_BATCH",
    "RankShard",
    "PaddingTrim",
    "padding_trim",
    "rank_data",
]


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
        "told. Say which: lit_amp.model.rank_placement.PerRank(dataset) when each rank's "
        "copy yields its own part (it shards itself by rank; used as it is), or "
        "lit_amp.model.rank_placement.SplitByRank(dataset) when every rank's copy yields the "
        "same stream "
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


def rank_data(dataset: Any, module: Any, *, train: bool) -> Any:
    """``dataset`` as ``module``'s rank should see it under data parallelism (decided late).

    Training: a DataLoader over a map-style dataset goes to Lightning unchanged
    (it gets Lightning's ``DistributedSampler``, or keeps the user's), any other dataset
    becomes a padded :class:`RankShard` (so a rank-aware sampler that is not a
    ``DistributedSampler`` is not split again by Lightning). Evaluation: an unpadded
    :class:`RankShard` (every batch on exactly one rank, counted once).

    Args:
        dataset: the user's dataset, or None.
        module: the LightningModule whose Trainer decides the placement.
        train: training (True) or evaluation data.

    Example:
        >>> list(rank_data([1, 2], None, train=False))
        [1, 2]
    """
    if dataset is None:
        return None
    if train and isinstance(dataset, torch.utils.data.DataLoader) and not isinstance(
            dataset.dataset, torch.utils.data.IterableDataset):
        own = _rank_aware(dataset)
        if own is None or (own is dataset.sampler
                           and isinstance(own, torch.utils.data.DistributedSampler)):
            return dataset  # Lightning splits it, or leaves the user's DistributedSampler be
    return RankShard(dataset, lambda: placement_of(module), train=train)
