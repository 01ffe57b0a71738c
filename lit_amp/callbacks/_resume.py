"""How a ``BackupAndRestore`` backup puts a run back where it stopped: random state and loaders.

The callback (:mod:`lit_amp.callbacks.backup_and_restore`) saves and restores; this module
holds what it saves and what the resumed run trains on:

* :func:`rng_state` / :func:`set_rng_state`: the global random state (torch, CUDA, numpy,
  ``random``) and the train ``DataLoader``'s generators, as plain values and tensors (loadable
  with ``torch.load(weights_only=True)``).
* :class:`Resume`: what the resumed run's first epoch takes from the backup, each piece once
  (the batches already trained, the random state that epoch started from and the one at the
  stop).
* :class:`SkipFirstBatches`: any re-iterable whose first pass leaves out the batches already
  trained; :func:`rebuild_loader`: a plain ``DataLoader`` rebuilt on a :class:`ResumeSampler`,
  which under DDP is Lightning's ``DistributedSampler`` with the absolute epoch, so a resumed
  run shuffles and splits as the uninterrupted one did.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
)

from lit_amp._runtime import rank, world_size

__all__ = [
    "Resume",
    "ResumeLoader",
    "ResumeSampler",
    "SkipFirstBatches",
    "loader_generators",
    "plain_loader",
    "rebuild_loader",
    "rng_state",
    "set_global_rng",
    "set_rng_state",
]


def loader_generators(dataset: Any) -> list[torch.Generator]:
    """The torch generators a DataLoader draws its order and seeds from (each once)."""
    found: list[torch.Generator] = []
    if not isinstance(dataset, torch.utils.data.DataLoader):
        return found
    batch_sampler = getattr(dataset, "batch_sampler", None)
    for owner in (dataset, getattr(dataset, "sampler", None),
                  getattr(batch_sampler, "sampler", None)):
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator) and all(g is not f for f in found):
            found.append(g)
    return found


def rng_state(generators: list[torch.Generator]) -> dict:
    """The global random state (torch, CUDA, numpy, ``random``) and ``generators``' states."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {"torch": torch.get_rng_state(), "loader": [g.get_state() for g in generators],
             # plain values and tensors only: loadable with torch.load(weights_only=True)
             "numpy": [str(kind), torch.from_numpy(np.array(keys, dtype=np.int64)), int(pos),
                       int(has_gauss), float(gauss)],
             "python": [int(version), torch.tensor(internal, dtype=torch.int64), gauss_next]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_global_rng(state: dict) -> None:
    """Put back the global generators of a :func:`_rng_state` (those it holds)."""
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if state.get("numpy") is not None:
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if state.get("python") is not None:
        version, internal, gauss_next = state["python"]
        random.setstate((version, tuple(int(v) for v in internal.tolist()), gauss_next))


def set_rng_state(state: dict, generators: list[torch.Generator]) -> None:
    """Put back the global generators and the DataLoader ``generators`` of a backup."""
    loader = list(state.get("loader") or [])
    if len(loader) != len(generators):
        raise RuntimeError(
            f"BackupAndRestore: the backup holds the state of {len(loader)} DataLoader "
            f"generator(s) but the train dataset has {len(generators)}; resume with the same "
            "train dataset (same shuffle / generator settings) the backup was made with."
        )
    set_global_rng(state)
    for g, st in zip(generators, loader):
        g.set_state(st)


class Resume:
    """What the resumed run's first epoch takes from the backup, each piece once.

    Args:
        skip: batches of the interrupted epoch already trained (per rank).
        start: the random state that epoch started from, per rank (index = rank).
        now: the global random state at the stop, per rank.
    """

    def __init__(self, skip: int = 0, start: list | None = None, now: list | None = None
                 ) -> None:
        self.skip, self.start, self.now = skip, start, now

    @staticmethod
    def _mine(states: list | None) -> dict | None:
        me = rank()
        state = states[me] if states and me < len(states) else None
        return state if isinstance(state, dict) else None

    def take_start(self) -> dict | None:
        """This rank's start state (once)."""
        state, self.start = self._mine(self.start), None
        return state

    def skipped(self, it: Iterator, per_batch: int, total: int | None = None) -> Iterator:
        """``it`` without its first ``skip * per_batch`` items (the first time only); then
        the global random state at the stop, right before the next batch is read.

        With ``total`` (the items ``it`` holds) it stops after the last one without asking
        for one more: exhausting a ``RandomSampler`` draws from its generator once more.
        """
        skip, self.skip = self.skip * per_batch, 0
        now, self.now = self._mine(self.now), None
        if not skip and now is None:
            yield from it
            return
        for _ in range(skip):
            if next(it, _END) is _END:
                return
        if now is not None:
            set_global_rng(now)
        if total is None:
            yield from it
            return
        for _ in range(total - skip):
            item = next(it, _END)
            if item is _END:
                return
            yield item


class SkipFirstBatches:
    """``dataset`` whose first iteration leaves out its first ``skip`` batches (read, untrained).

    The skip is taken lazily by the first iterator that yields, so an iterator that is
    created and dropped (Lightning checks iterability that way) does not use it up.
    """

    def __init__(self, dataset: Iterable, resume: Resume) -> None:
        self.dataset = dataset
        self.resume = resume

    def __iter__(self) -> Iterator:
        try:
            total: int | None = len(self.dataset)
        except TypeError:
            total = None
        # stop after the last batch without asking for one more, as Lightning does with a
        # sized loader: exhausting it would draw from the sampler's generator once more
        yield from self.resume.skipped(iter(self.dataset), 1, total)

    def __len__(self) -> int:
        return len(self.dataset)


_END = object()

_LOADER_ARGS = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
                "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers",
                "pin_memory_device", "in_order")


def plain_loader(dataset: Any) -> bool:
    """A ``DataLoader`` of the default samplers, which :class:`ResumeSampler` reproduces."""
    return (type(dataset) is DataLoader and type(dataset.batch_sampler) is BatchSampler
            and type(dataset.sampler) in (RandomSampler, SequentialSampler))


class ResumeSampler(DistributedSampler):
    """The sampler of a :class:`ResumeLoader`, decided when first used.

    Under DDP it is the ``DistributedSampler`` Lightning would inject (same split and seed)
    with the absolute epoch (``set_epoch(e)`` uses ``e + epoch_offset``); in one process it
    is the loader's own sampler. Either way its first iteration leaves out the items of the
    batches already trained (``resume``).
    """

    def __init__(self, original: Any, batch_size: int, epoch_offset: int, resume: Resume,
                 seed: int) -> None:  # DistributedSampler.__init__ waits for the process group
        self.original, self.batch_size, self.seed_ = original, batch_size, seed
        self.epoch_offset, self.resume = epoch_offset, resume
        self.lightning_epoch = 0
        self.distributed: bool | None = None

    def _resolve(self) -> bool:
        if self.distributed is None:
            size = world_size()
            self.distributed = size > 1
            if self.distributed:
                DistributedSampler.__init__(
                    self, self.original.data_source, num_replicas=size, rank=rank(),
                    # Lightning shuffles every training loader it distributes, a sequential
                    # one too (data_connector._process_dataloader): the same order as a run
                    # without this callback
                    shuffle=True,
                    seed=self.seed_, drop_last=False)
        return bool(self.distributed)

    def set_epoch(self, epoch: int) -> None:
        """Lightning's epoch of the run; the sampler shuffles with the absolute epoch."""
        self.lightning_epoch = epoch

    def __iter__(self) -> Iterator:
        if self._resolve():
            self.epoch = self.lightning_epoch + self.epoch_offset
            it = DistributedSampler.__iter__(self)
        else:
            it = iter(self.original)
        return self.resume.skipped(it, self.batch_size, len(self))

    def __len__(self) -> int:
        return DistributedSampler.__len__(self) if self._resolve() else len(self.original)


class ResumeLoader(DataLoader):
    """The train ``DataLoader`` rebuilt on a :class:`ResumeSampler` (same arguments).

    Before its first iterator (which draws the workers' base seed) it calls ``on_first_iter``:
    under DDP the rank's own random state is put back there, the process group being known.
    """

    on_first_iter: Any = None

    def __iter__(self) -> Any:
        hook, self.on_first_iter = self.on_first_iter, None
        if hook is not None:
            hook()
        return super().__iter__()


def rebuild_loader(loader: DataLoader, epoch_offset: int, resume: Resume, seed: int
                   ) -> ResumeLoader:
    """``loader`` rebuilt on a :class:`ResumeSampler` with the same arguments."""
    kw = {k: getattr(loader, k) for k in _LOADER_ARGS if hasattr(loader, k)}
    if not kw.get("num_workers"):
        kw.pop("prefetch_factor", None)
        kw.pop("persistent_workers", None)
    sampler = ResumeSampler(loader.sampler, int(loader.batch_size or 1), epoch_offset, resume,
                            seed)
    return ResumeLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                         drop_last=loader.drop_last, **kw)
