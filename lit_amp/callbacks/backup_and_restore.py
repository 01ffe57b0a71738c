"""MindSpore's ``BackupAndRestore``: back up the training state each epoch, resume from it.

Resuming is exact: the resumed run trains the same batches, in the same order, with the same
random numbers, as a run that was never interrupted (bit-identical weights on CPU), in one
process and under DDP. The backup holds, besides the weights, the random state the next epoch
starts from, the position of a stop requested mid-epoch and the ``state_dict()`` of the run's
other stateful callbacks, so that ``ModelCheckpoint``'s files keep the uninterrupted run's
names. What is guaranteed, under which loaders and process counts, and the known limits are in
docs/reliability.md, "Model.train: stop and resume". The random state and the loaders of a
resumed run live in :mod:`lit_amp.callbacks._resume`.
"""
from __future__ import annotations

import logging
import os
import stat
from typing import Any

import torch

from lit_amp._io import remove_stale_temps
from lit_amp._runtime import gather, world_size
from lit_amp._validation import check_bool, check_int
from lit_amp.callbacks._resume import (
    Resume,
    SkipFirstBatches,
    loader_generators,
    plain_loader,
    rebuild_loader,
    rng_state,
    set_rng_state,
)
from lit_amp.callbacks._utils import is_rank_zero
from lit_amp.callbacks.base import Callback, RunContext
from lit_amp.serialization import checkpoint_payload, load_checkpoint, write_checkpoint

__all__ = ["BackupAndRestore"]

log = logging.getLogger(__name__)


class BackupAndRestore(Callback):
    """Save ``{backup_dir}/backup.ckpt`` every ``save_freq`` epochs; restore it to resume.

    At a train epoch end with ``cur_epoch_num % save_freq == 0`` the train network's state
    (network, optimizer, loss scale) is written atomically with
    ``append_info = {"epoch_num": cur_epoch_num, "step_num": cur_step_num, "step_in_epoch": 0,
    "rng": <random state>, "callback_states": <the other callbacks' state_dict()>}``. A stop
    requested mid-epoch writes the position instead
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
        self._exact_ddp = False  # the train loader was rebuilt (see ResumeLoader)
        self._callback_states: dict = {}  # the backup's, for the resumed run's callbacks
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
        self._generators = loader_generators(train_dataset)
        resume, self._resume = self._resume, {}
        restored_epoch = int(resume.get("epoch_num", 0))
        usable = bool(resume) and (initial_epoch is None or initial_epoch == restored_epoch)
        starts = resume.get("rng_ranks") or [resume.get("rng")] if usable else None
        skip = int(resume.get("step_in_epoch", 0)) if usable else 0
        self._callback_states = dict(resume.get("callback_states") or {}) if usable else {}
        plan = Resume(skip, starts,
                       resume.get("rng_now_ranks") or [resume.get("rng_now")] if skip else None)
        first = plan.take_start() if starts else None  # this process's (rank 0 before DDP)
        if first is not None:
            set_rng_state(first, self._generators)
        self._prefit_state = rng_state(self._generators)
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
        if not dataset_sink_mode and plain_loader(train_dataset):
            self._exact_ddp = True
            # the seed of the run that wrote the backup (Lightning's is PL_GLOBAL_SEED): a
            # resumed run with another seed would draw other permutations
            self._seed = int(resume.get("sampler_seed", os.getenv("PL_GLOBAL_SEED", "0")))
            loader = rebuild_loader(train_dataset, int(initial_epoch or restored_epoch or 0), plan,
                              self._seed)
            loader.on_first_iter = lambda: self._first_iter(plan)
            return loader
        return SkipFirstBatches(train_dataset, plan) if skip > 0 else train_dataset

    def _first_iter(self, plan: Resume) -> None:
        """Under DDP, right before the first iterator: this rank's own start state."""
        if world_size() == 1:
            return
        state = plan.take_start()
        if state is not None:
            set_rng_state(state, self._generators)
        self._prefit_state = rng_state(self._generators)

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
            states, self._callback_states = self._callback_states, {}
            for key, other in _stateful(cb, self).items():
                if key in states:
                    other.load_state_dict(states[key])
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
            self._start_state = rng_state(self._generators)
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
                starts = gather(rng_state(self._generators))
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
        starts = gather(self._start_state)
        nows = gather(rng_state([]))
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
        info["callback_states"] = {k: c.state_dict() for k, c in _stateful(cb, self).items()}
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


def _stateful(cb: Any, me: Callback) -> dict[str, Any]:
    """The run's other callbacks with a ``state_dict`` / ``load_state_dict`` (such as
    ``ModelCheckpoint``: its prefix and step cadence), keyed by class name and occurrence."""
    out: dict[str, Any] = {}
    for other in cb.get("list_callback") or ():
        if other is me or not (callable(getattr(other, "state_dict", None))
                               and callable(getattr(other, "load_state_dict", None))):
            continue
        name = type(other).__name__
        n = sum(k.split("#")[0] == name for k in out)
        out[f"{name}#{n}" if n else name] = other
    return out
