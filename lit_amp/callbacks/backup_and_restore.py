"""MindSpore's ``BackupAndRestore``: back up the training state each epoch, resume from it.

Resuming is exact: the resumed run trains the same batches, in the same order, with the same
random numbers, as a run that was never interrupted (bit-identical weights on CPU).

* At every epoch boundary the backup also holds the random state the next epoch starts from:
  the state of the train ``DataLoader``'s generators (``DataLoader(generator=...)``, a
  ``RandomSampler``'s own generator) and of torch's global CPU (and CUDA) RNG, which a
  ``RandomSampler`` without a generator and dropout draw from. :meth:`prepare_dataset` puts it
  back before the resumed run creates its first iterator, so a shuffled epoch sees the same
  permutation.
* A stop requested in the middle of an epoch (``OnRequestExit`` on SIGTERM, any
  ``request_stop``) is not an epoch end: the backup records the epochs completed, the number
  of batches of the interrupted epoch already trained, the random state that epoch started
  from and the global RNG state at the stop. The resumed run re-creates that epoch's batch
  order, skips (reads without training) the batches already trained and continues with the
  global RNG where it stopped. The backup is kept at train end when the run did not reach its
  last epoch.
* In sink mode an epoch is one sink and a stop takes effect at its end: every stop is at an
  epoch boundary. Under DDP a mid-epoch stop keeps the last epoch-boundary backup instead (a
  warning says so): the interrupted epoch is trained again from its start, from that epoch's
  starting weights and random state, so nothing is trained twice into the weights either.
* Other random state (numpy, Python's ``random``, DataLoader workers' own generators beyond
  their torch seed, a custom iterable's private RNG) is not saved.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from lit_amp._io import load_checkpoint, save_checkpoint
from lit_amp._validation import check_bool, check_int
from lit_amp.callbacks._utils import is_rank_zero
from lit_amp.callbacks.base import Callback, RunContext

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


def _rng_state(generators: list[torch.Generator]) -> dict:
    state = {"torch": torch.get_rng_state(), "loader": [g.get_state() for g in generators]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict, generators: list[torch.Generator]) -> None:
    loader = list(state.get("loader") or [])
    if len(loader) != len(generators):
        raise RuntimeError(
            f"BackupAndRestore: the backup holds the state of {len(loader)} DataLoader "
            f"generator(s) but the train dataset has {len(generators)}; resume with the same "
            "train dataset (same shuffle / generator settings) the backup was made with."
        )
    torch.set_rng_state(state["torch"])
    for g, st in zip(generators, loader):
        g.set_state(st)
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class _SkipFirstBatches:
    """``dataset`` whose first iteration leaves out its first ``skip`` batches (read, untrained).

    The skip is taken lazily by the first iterator that yields, so an iterator that is
    created and dropped (Lightning checks iterability that way) does not use it up.
    """

    def __init__(self, dataset: Iterable, skip: int) -> None:
        self.dataset = dataset
        self.skip = skip

    def __iter__(self) -> Iterator:
        skip, self.skip = self.skip, 0
        it = iter(self.dataset)
        for _ in range(skip):
            if next(it, _END) is _END:
                return
        try:
            left = len(self.dataset) - skip  # type: ignore[arg-type]
        except TypeError:
            yield from it
            return
        # stop after the last batch without asking for one more, as Lightning does with a
        # sized loader: exhausting it would draw from the sampler's generator once more
        for _ in range(left):
            batch = next(it, _END)
            if batch is _END:
                return
            yield batch

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]


_END = object()


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
    MindSpore does) without changing the epoch counter. Only global rank 0 writes or deletes.

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
        self._now_state: dict | None = None  # the global RNG at the stop, put back at step 1
        self._steps = 0  # batches of the current epoch trained (including skipped ones)
        self._first_epoch = True

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

        Args:
            train_dataset: the train DataLoader or re-iterable of batches.
            dataset_sink_mode: whether the run trains in sink mode.
            initial_epoch: the epoch count the run starts from; the backup's position is
                used only when it equals the restored ``epoch_num`` (None: it does).

        Returns:
            ``train_dataset``, or a wrapper whose first iteration leaves out the batches of the
            interrupted epoch that were already trained.

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
        if usable and isinstance(resume.get("rng"), dict):
            _set_rng_state(resume["rng"], self._generators)
        self._prefit_state = _rng_state(self._generators)
        skip = int(resume.get("step_in_epoch", 0)) if usable else 0
        if skip <= 0:
            return train_dataset
        if dataset_sink_mode:
            raise RuntimeError(
                f"BackupAndRestore: the backup {self.backup_file!r} was made {skip} batches into "
                f"epoch {restored_epoch + 1}, which sink mode cannot resume; resume with "
                "dataset_sink_mode=False."
            )
        self._skip = skip
        now = resume.get("rng_now")
        self._now_state = now if isinstance(now, dict) else None
        log.info("Resuming epoch %d after its first %d batches (already trained).",
                 restored_epoch + 1, skip)
        return _SkipFirstBatches(train_dataset, skip)

    def on_train_begin(self, run_context: RunContext) -> None:
        """Load the backup unless :meth:`restore` already did for this run.

        Raises:
            RuntimeError: a mid-epoch backup is resumed by more than one process.
        """
        self._first_epoch = True
        cb = run_context.original_args()
        if self._restored:
            self._restored = False
            if self._skip and int(cb.get("device_number", 1) or 1) > 1:
                raise RuntimeError(
                    f"BackupAndRestore: the backup {self.backup_file!r} was made mid-epoch by "
                    "one process; resume it with one process (device_number is "
                    f"{cb.get('device_number')})."
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

    def on_train_step_begin(self, run_context: RunContext) -> None:
        """After a resume mid-epoch, continue with the global RNG where the stop left it."""
        if self._now_state is not None:
            torch.set_rng_state(self._now_state["torch"])
            if "cuda" in self._now_state and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(self._now_state["cuda"])
            self._now_state = None

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
        """Write the backup every ``save_freq`` epochs, or the position of a mid-epoch stop."""
        cb = run_context.original_args()
        epoch = int(cb.get("cur_epoch_num", 0))
        step_num = int(cb.get("cur_step_num", 0))
        if self._epoch_complete(cb, run_context):
            if epoch % self.save_freq == 0:
                self._save(cb, {"epoch_num": epoch, "step_num": step_num, "step_in_epoch": 0,
                                "rng": _rng_state(self._generators)})
                log.info("Backed up epoch %d to %s.", epoch, self.backup_file)
            return
        if int(cb.get("device_number", 1) or 1) > 1:
            log.warning(
                "BackupAndRestore: training stopped inside epoch %d; a multi-process run resumes "
                "only from epoch boundaries, so the resumed run trains epoch %d again from its "
                "start (from the backup of an earlier epoch, not from the weights of this "
                "partial epoch).", epoch, epoch,
            )
            return
        self._save(cb, {"epoch_num": epoch - 1, "step_num": step_num,
                        "step_in_epoch": self._steps, "rng": self._start_state,
                        "rng_now": _rng_state([])})
        log.info("Backed up epoch %d after %d batches to %s.", epoch, self._steps,
                 self.backup_file)

    def _save(self, cb: Any, info: dict) -> None:
        if not is_rank_zero(cb):
            return
        target = cb.get("train_network")
        if target is None:
            target = cb.get("network")
        save_checkpoint(target, self.backup_file, info)

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
