"""MindSpore's ``BackupAndRestore``: back up the training state each epoch, resume from it.

Resuming is exact: the resumed run trains the same batches, in the same order, with the same
random numbers, as a run that was never interrupted (bit-identical weights on CPU), in one
process and under DDP.

* At every epoch boundary the backup also holds the random state the next epoch starts from:
  the state of the train ``DataLoader``'s generators (``DataLoader(generator=...)``, a
  ``RandomSampler``'s own generator), of torch's global CPU (and CUDA) RNG, which a
  ``RandomSampler`` without a generator and dropout draw from, and of numpy's and Python's
  ``random`` global generators. :meth:`prepare_dataset` puts it back before the resumed run
  creates its first iterator, so a shuffled epoch sees the same permutation.
* A stop requested in the middle of an epoch (``OnRequestExit`` on SIGTERM, any
  ``request_stop``) is not an epoch end: the backup records the epochs completed, the number
  of batches of the interrupted epoch already trained, the random state that epoch started
  from and the global random state at the stop. The resumed run re-creates that epoch's batch
  order, skips (reads without training) the batches already trained, continues with the
  global random state where it stopped and with ``cur_step_num`` at the batches already
  trained. The backup is kept at train end when the run did not reach its last epoch.
* Under DDP every rank's random state is saved (gathered to rank 0, which writes) and each
  rank gets its own back. A plain ``DataLoader`` (default random or sequential sampler) is
  rebuilt with a ``DistributedSampler`` that is Lightning's own (same split, same seed,
  ``PL_GLOBAL_SEED`` or 0) except that its epoch is the absolute epoch, so the resumed epochs
  shuffle as the uninterrupted run's did, and that it leaves out each rank's batches already
  trained. A mid-epoch backup resumes only with the number of processes that wrote it and a
  plain ``DataLoader``; anything else is refused with a ``RuntimeError`` saying what to do.
  Over another train dataset several processes keep the last epoch-boundary backup at a
  mid-epoch stop (a warning says so): the interrupted epoch is trained again from its start.
* In sink mode an epoch is one sink and a stop takes effect at its end: every stop is at an
  epoch boundary.
* Other random state (DataLoader workers' own generators beyond their torch seed, a custom
  iterable's private RNG) is not saved.

Size: the callback and the loader, sampler and skip wrapper that resume a run mid-epoch
share one backup format and its random-state rules; ~590 lines with their docstrings.
"""
from __future__ import annotations

import logging
import os
import random
import stat
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

from lit_amp._io import remove_stale_temps
from lit_amp._runtime import dist_ready
from lit_amp._validation import check_bool, check_int
from lit_amp.callbacks._utils import is_rank_zero
from lit_amp.callbacks.base import Callback, RunContext
from lit_amp.serialization import checkpoint_payload, load_checkpoint, write_checkpoint

__all__ = ["BackupAndRestore"]

log = logging.getLogger(__name__)


def _generators(dataset: Any) -> list[torch.Generator]:
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


def _world() -> tuple[int, int]:
    """``(rank, world_size)`` of an initialized torch.distributed, else ``(0, 1)``."""
    dist = torch.distributed
    if dist_ready():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _gather(obj: Any) -> list[Any]:
    """``obj`` of every rank, indexed by rank (``[obj]`` in one process)."""
    rank, world = _world()
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    torch.distributed.all_gather_object(out, obj)
    return out


def _rng_state(generators: list[torch.Generator]) -> dict:
    """The global random state (torch, CUDA, numpy, ``random``) and ``generators``' states."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()  # type: ignore[misc]
    version, internal, gauss_next = random.getstate()
    state = {"torch": torch.get_rng_state(), "loader": [g.get_state() for g in generators],
             # plain values and tensors only: loadable with torch.load(weights_only=True)
             "numpy": [str(kind), torch.from_numpy(np.array(keys, dtype=np.int64)), int(pos),
                       int(has_gauss), float(gauss)],
             "python": [int(version), torch.tensor(internal, dtype=torch.int64), gauss_next]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_global_rng(state: dict) -> None:
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


def _set_rng_state(state: dict, generators: list[torch.Generator]) -> None:
    loader = list(state.get("loader") or [])
    if len(loader) != len(generators):
        raise RuntimeError(
            f"BackupAndRestore: the backup holds the state of {len(loader)} DataLoader "
            f"generator(s) but the train dataset has {len(generators)}; resume with the same "
            "train dataset (same shuffle / generator settings) the backup was made with."
        )
    _set_global_rng(state)
    for g, st in zip(generators, loader):
        g.set_state(st)


class _Resume:
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
        rank, _ = _world()
        state = states[rank] if states and rank < len(states) else None
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
            _set_global_rng(now)
        if total is None:
            yield from it
            return
        for _ in range(total - skip):
            item = next(it, _END)
            if item is _END:
                return
            yield item


class _SkipFirstBatches:
    """``dataset`` whose first iteration leaves out its first ``skip`` batches (read, untrained).

    The skip is taken lazily by the first iterator that yields, so an iterator that is
    created and dropped (Lightning checks iterability that way) does not use it up.
    """

    def __init__(self, dataset: Iterable, resume: _Resume) -> None:
        self.dataset = dataset
        self.resume = resume

    def __iter__(self) -> Iterator:
        try:
            total: int | None = len(self.dataset)  # type: ignore[arg-type]
        except TypeError:
            total = None
        # stop after the last batch without asking for one more, as Lightning does with a
        # sized loader: exhausting it would draw from the sampler's generator once more
        yield from self.resume.skipped(iter(self.dataset), 1, total)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]


_END = object()

_LOADER_ARGS = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
                "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers",
                "pin_memory_device", "in_order")


def _plain_loader(dataset: Any) -> bool:
    """A ``DataLoader`` of the default samplers, which :class:`_ResumeSampler` reproduces."""
    return (type(dataset) is DataLoader and type(dataset.batch_sampler) is BatchSampler
            and type(dataset.sampler) in (RandomSampler, SequentialSampler))


class _ResumeSampler(DistributedSampler):
    """The sampler of a :class:`_ResumeLoader`, decided when first used.

    Under DDP it is the ``DistributedSampler`` Lightning would inject (same split and seed)
    with the absolute epoch (``set_epoch(e)`` uses ``e + epoch_offset``); in one process it
    is the loader's own sampler. Either way its first iteration leaves out the items of the
    batches already trained (``resume``).
    """

    def __init__(self, original: Any, batch_size: int, epoch_offset: int, resume: _Resume,
                 seed: int) -> None:  # DistributedSampler.__init__ waits for the process group
        self.original, self.batch_size, self.seed_ = original, batch_size, seed
        self.epoch_offset, self.resume = epoch_offset, resume
        self.lightning_epoch = 0
        self.distributed: bool | None = None

    def _resolve(self) -> bool:
        if self.distributed is None:
            rank, world = _world()
            self.distributed = world > 1
            if self.distributed:
                DistributedSampler.__init__(
                    self, self.original.data_source, num_replicas=world, rank=rank,
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


class _ResumeLoader(DataLoader):
    """The train ``DataLoader`` rebuilt on a :class:`_ResumeSampler` (same arguments).

    Before its first iterator (which draws the workers' base seed) it calls ``on_first_iter``:
    under DDP the rank's own random state is put back there, the process group being known.
    """

    on_first_iter: Any = None

    def __iter__(self) -> Any:
        hook, self.on_first_iter = self.on_first_iter, None
        if hook is not None:
            hook()
        return super().__iter__()


def _rebuild(loader: DataLoader, epoch_offset: int, resume: _Resume, seed: int
             ) -> _ResumeLoader:
    kw = {k: getattr(loader, k) for k in _LOADER_ARGS if hasattr(loader, k)}
    if not kw.get("num_workers"):
        kw.pop("prefetch_factor", None)
        kw.pop("persistent_workers", None)
    sampler = _ResumeSampler(loader.sampler, int(loader.batch_size or 1), epoch_offset, resume,
                             seed)
    return _ResumeLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                         drop_last=loader.drop_last, **kw)


class BackupAndRestore(Callback):
    """Save ``{backup_dir}/backup.ckpt`` every ``save_freq`` epochs; restore it to resume.

    At a train epoch end with ``cur_epoch_num % save_freq == 0`` the train network's state
    (network, optimizer, loss scale) is written atomically with
    ``append_info = {"epoch_num": cur_epoch_num, "step_num": cur_step_num, "step_in_epoch": 0,
    "rng": <random state>}``. A stop requested mid-epoch writes the position instead
    (``epoch_num`` = the epochs completed, ``step_in_epoch`` = the batches of the next epoch
    already trained; see the module docstring). At train end the file is deleted when
    ``delete_checkpoint`` is True and the run reached its last epoch; a run that dies or is
    stopped early keeps it.

    To resume, ``Model`` calls :meth:`restore` before training: it loads the backup into the
    train network and returns the epochs completed, from which training continues; then
    :meth:`prepare_dataset` restores the random state and skips the batches already trained.
    If :meth:`restore` was not called for the run, ``on_train_begin`` loads the weights (as
    MindSpore does) without changing the epoch counter. Only global rank 0 writes or deletes;
    at train begin it also removes the temp files of ``backup.ckpt`` that a process killed
    while writing it left in ``backup_dir`` (no other file).

    Args:
        backup_dir: the folder of ``backup.ckpt`` (created if missing).
        save_freq: ``'epoch'`` (every epoch) or a positive int number of epochs.
        delete_checkpoint: delete the backup when training ends.

    Raises:
        TypeError: ``backup_dir`` is not a str path; ``save_freq`` is neither a str nor an
            int; ``delete_checkpoint`` is not a bool.
        ValueError: ``save_freq`` is a str other than 'epoch' or an int < 1.

    Example:
        >>> import tempfile
        >>> cb = BackupAndRestore(tempfile.mkdtemp(), save_freq=2)
        >>> cb.save_freq, cb.backup_file.endswith("backup.ckpt")
        (2, True)
    """

    def __init__(
        self,
        backup_dir: str | os.PathLike,
        save_freq: str | int = "epoch",
        delete_checkpoint: bool = True,
    ) -> None:
        super().__init__()
        owner = "BackupAndRestore"
        if not isinstance(backup_dir, (str, os.PathLike)):
            raise TypeError(
                f"For '{owner}', the argument 'backup_dir' must be a str path, but got "
                f"{backup_dir!r} of type {type(backup_dir).__name__}."
            )
        directory = os.path.abspath(os.fspath(backup_dir))
        os.makedirs(directory, exist_ok=True)
        self.backup_file = os.path.join(directory, "backup.ckpt")
        if isinstance(save_freq, str):
            if save_freq != "epoch":
                raise ValueError(
                    f"For '{owner}', the argument 'save_freq' must be 'epoch' or a positive int, "
                    f"but got {save_freq!r}."
                )
            self.save_freq = 1
        else:
            if isinstance(save_freq, bool) or not isinstance(save_freq, int):
                raise TypeError(
                    f"For '{owner}', the argument 'save_freq' must be 'epoch' or a positive int, "
                    f"but got {save_freq!r} of type {type(save_freq).__name__}."
                )
            self.save_freq = check_int(owner, "save_freq", save_freq, minimum=1)
        self.delete_checkpoint = check_bool(owner, "delete_checkpoint", delete_checkpoint)
        self._restored = False
        self._reset_run()

    def _reset_run(self) -> None:
        self._resume: dict = {}  # the append_info restore() read, until prepare_dataset
        self._generators: list[torch.Generator] = []
        self._start_state: dict | None = None  # random state the current epoch started from
        self._prefit_state: dict | None = None  # taken before the run's first iterator
        self._skip = 0  # batches of the run's first epoch already trained before the resume
        self._skip_world = 1  # the number of processes that wrote a mid-epoch backup
        self._seed = int(os.getenv("PL_GLOBAL_SEED", "0"))  # the DDP sampler's seed
        self._exact_ddp = False  # the train loader was rebuilt (see _ResumeLoader)
        self._steps = 0  # batches of the current epoch trained (including skipped ones)
        self._first_epoch = True
        #: ``cur_step_num`` the resumed run starts from (the batches of its first epoch
        #: already trained before a mid-epoch stop; 0 otherwise). The bridge reads it.
        self.resume_step_num = 0

    def restore(self, train_network: Any) -> int:
        """Load the backup (if any) into ``train_network``; return the epochs it completed.

        Args:
            train_network: an object with ``load_checkpoint_state`` (or a ``torch.nn.Module``).

        Returns:
            The saved ``epoch_num`` (training resumes after it), or 0 when there is no backup.

        Raises:
            ValueError: the backup cannot be read safely (the message names the file).
        """
        self._restored = True
        self._reset_run()
        if not os.path.isfile(self.backup_file):
            return 0
        log.info("Restoring the backup %s into the train network.", self.backup_file)
        state = load_checkpoint(self.backup_file, net=train_network)
        self._resume = dict(state.get("append_info") or {})
        return int(self._resume.get("epoch_num", 0))

    def prepare_dataset(self, train_dataset: Any, dataset_sink_mode: bool = False,
                        initial_epoch: int | None = None) -> Any:
        """Put back the backup's random state; return the dataset the resumed run trains on.

        Call it after :meth:`restore`, right before training starts (``Model.train`` does).
        Without a backup it only remembers the random state the first epoch starts from.
        A plain ``DataLoader`` is rebuilt on a sampler that resumes exactly under DDP too
        (see the module docstring).

        Args:
            train_dataset: the train DataLoader or re-iterable of batches.
            dataset_sink_mode: whether the run trains in sink mode.
            initial_epoch: the epoch count the run starts from; the backup's position is
                used only when it equals the restored ``epoch_num`` (None: it does).

        Returns:
            ``train_dataset``, or a loader or wrapper whose first iteration leaves out the
            batches of the interrupted epoch that were already trained.

        Raises:
            RuntimeError: the backup's random state does not fit ``train_dataset`` (another
                number of DataLoader generators), or it was made mid-epoch and the run is in
                sink mode.

        Example:
            >>> import tempfile
            >>> cb = BackupAndRestore(tempfile.mkdtemp())
            >>> cb.restore(torch.nn.Linear(2, 2))  # no backup yet: start from epoch 0
            0
            >>> data = [1, 2, 3]
            >>> cb.prepare_dataset(data) is data  # nothing to skip
            True
        """
        self._generators = _generators(train_dataset)
        resume, self._resume = self._resume, {}
        restored_epoch = int(resume.get("epoch_num", 0))
        usable = bool(resume) and (initial_epoch is None or initial_epoch == restored_epoch)
        starts = resume.get("rng_ranks") or [resume.get("rng")] if usable else None
        skip = int(resume.get("step_in_epoch", 0)) if usable else 0
        plan = _Resume(skip, starts,
                       resume.get("rng_now_ranks") or [resume.get("rng_now")] if skip else None)
        first = plan.take_start() if starts else None  # this process's (rank 0 before DDP)
        if first is not None:
            _set_rng_state(first, self._generators)
        self._prefit_state = _rng_state(self._generators)
        plan.start = starts  # each DDP rank takes its own before its first iterator
        if skip > 0 and dataset_sink_mode:
            raise RuntimeError(
                f"BackupAndRestore: the backup {self.backup_file!r} was made {skip} batches into "
                f"epoch {restored_epoch + 1}, which sink mode cannot resume; resume with "
                "dataset_sink_mode=False."
            )
        self._skip, self._skip_world = skip, int(resume.get("world_size", 1) or 1)
        self.resume_step_num = skip
        if skip:
            log.info("Resuming epoch %d after its first %d batches (already trained).",
                     restored_epoch + 1, skip)
        if not dataset_sink_mode and _plain_loader(train_dataset):
            self._exact_ddp = True
            # the seed of the run that wrote the backup (Lightning's is PL_GLOBAL_SEED): a
            # resumed run with another seed would draw other permutations
            self._seed = int(resume.get("sampler_seed", os.getenv("PL_GLOBAL_SEED", "0")))
            loader = _rebuild(train_dataset, int(initial_epoch or restored_epoch or 0), plan,
                              self._seed)
            loader.on_first_iter = lambda: self._first_iter(plan)
            return loader
        return _SkipFirstBatches(train_dataset, plan) if skip > 0 else train_dataset

    def _first_iter(self, plan: _Resume) -> None:
        """Under DDP, right before the first iterator: this rank's own start state."""
        if _world()[1] == 1:
            return
        state = plan.take_start()
        if state is not None:
            _set_rng_state(state, self._generators)
        self._prefit_state = _rng_state(self._generators)

    def on_train_begin(self, run_context: RunContext) -> None:
        """Load the backup unless :meth:`restore` already did for this run.

        Raises:
            RuntimeError: a mid-epoch backup is resumed by another number of processes than
                wrote it, or by several processes over a dataset that is not a plain
                ``DataLoader``.
        """
        self._first_epoch = True
        cb = run_context.original_args()
        if is_rank_zero(cb):
            name = os.path.basename(self.backup_file)
            removed = remove_stale_temps(os.path.dirname(self.backup_file),
                                         lambda target: target == name)
            if removed:
                log.info("BackupAndRestore: removed %d temp file(s) of an interrupted backup "
                         "write: %s", len(removed),
                         ", ".join(os.path.basename(p) for p in removed))
        world = int(cb.get("device_number", 1) or 1)
        if self._restored:
            self._restored = False
            if self._skip and world != self._skip_world:
                raise RuntimeError(
                    f"BackupAndRestore: the backup {self.backup_file!r} was made mid-epoch by "
                    f"{self._skip_world} process(es); resume it with {self._skip_world} "
                    f"(device_number is {world})."
                )
            if self._skip and world > 1 and not self._exact_ddp:
                raise RuntimeError(
                    f"BackupAndRestore: the backup {self.backup_file!r} was made mid-epoch; "
                    "several processes resume it exactly only from a torch DataLoader with the "
                    "default sampler (shuffle=True/False); pass such a DataLoader, or resume "
                    "with one process."
                )
            return
        if os.path.isfile(self.backup_file):
            target = cb.get("train_network")
            if target is None:
                target = cb.get("network")
            log.info("Restoring the backup %s into the train network.", self.backup_file)
            load_checkpoint(self.backup_file, net=target)

    def on_train_epoch_begin(self, run_context: RunContext) -> None:
        """Remember the random state this epoch's batch order is drawn from."""
        if self._first_epoch and self._prefit_state is not None:
            self._start_state = self._prefit_state  # the iterator existed before the hook
            self._steps = self._skip
        else:
            self._start_state = _rng_state(self._generators)
            self._steps = 0
        self._first_epoch = False

    def on_train_step_end(self, run_context: RunContext) -> None:
        """Count the batches of this epoch (the position a mid-epoch backup records)."""
        cb = run_context.original_args()
        self._steps += 1 if not cb.get("dataset_sink_mode") else 0

    def _epoch_complete(self, cb: Any, run_context: RunContext) -> bool:
        batch_num = cb.get("batch_num")
        if cb.get("dataset_sink_mode"):
            return True  # an epoch is one sink: a stop takes effect at its end
        if batch_num:
            return self._steps >= int(batch_num)
        return not run_context.get_stop_requested()  # unknown length: a stop is mid-epoch

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        """Write the backup every ``save_freq`` epochs, or the position of a mid-epoch stop.

        Under DDP every rank's random state is gathered (a collective: every rank calls it)
        and rank 0 writes.
        """
        cb = run_context.original_args()
        epoch = int(cb.get("cur_epoch_num", 0))
        step_num = int(cb.get("cur_step_num", 0))
        world = int(cb.get("device_number", 1) or 1)
        if self._epoch_complete(cb, run_context):
            if epoch % self.save_freq == 0:
                starts = _gather(_rng_state(self._generators))
                self._save(cb, {"epoch_num": epoch, "step_num": step_num, "step_in_epoch": 0,
                                "rng": starts[0], "rng_ranks": starts, "world_size": world})
                log.info("Backed up epoch %d to %s.", epoch, self.backup_file)
            return
        if world > 1 and not self._exact_ddp:
            log.warning(
                "BackupAndRestore: training stopped inside epoch %d; several processes resume "
                "mid-epoch only over a torch DataLoader with the default sampler, so the "
                "resumed run trains epoch %d again from its start (from the backup of an "
                "earlier epoch, not from the weights of this partial epoch).", epoch, epoch,
            )
            return
        starts = _gather(self._start_state)
        nows = _gather(_rng_state([]))
        self._save(cb, {"epoch_num": epoch - 1, "step_num": step_num,
                        "step_in_epoch": self._steps, "rng": starts[0], "rng_now": nows[0],
                        "rng_ranks": starts, "rng_now_ranks": nows, "world_size": world})
        log.info("Backed up epoch %d after %d batches to %s.", epoch, self._steps,
                 self.backup_file)

    def _save(self, cb: Any, info: dict) -> None:
        target = cb.get("train_network")
        if target is None:
            target = cb.get("network")
        info["sampler_seed"] = self._seed
        payload = checkpoint_payload(target, info)  # every rank: may be a collective
        if is_rank_zero(cb):
            write_checkpoint(payload, self.backup_file)

    def on_train_end(self, run_context: RunContext) -> None:
        """Delete the backup if ``delete_checkpoint`` and the run reached its last epoch."""
        self._restored = False
        cb = run_context.original_args()
        last = int(cb.get("initial_epoch", 0) or 0) + int(cb.get("epoch_num", 0) or 0)
        finished = int(cb.get("cur_epoch_num", 0)) >= last and self._epoch_complete(
            cb, run_context
        )
        self._reset_run()
        if not finished:
            log.info("Training stopped before its last epoch: keeping the backup %s.",
                     self.backup_file)
            return
        if self.delete_checkpoint and is_rank_zero(cb) and os.path.isfile(self.backup_file):
            os.chmod(self.backup_file, stat.S_IWRITE | stat.S_IREAD)
            os.remove(self.backup_file)
            log.info("Deleted the backup %s.", self.backup_file)
