"""MindSpore's ``BackupAndRestore``: back up the training state each epoch, resume from it."""

from __future__ import annotations

import logging
import os
import stat
from typing import Any

from lit_amp._io import load_checkpoint, save_checkpoint
from lit_amp._validation import check_bool, check_int
from lit_amp.callbacks._utils import is_rank_zero
from lit_amp.callbacks.base import Callback, RunContext

__all__ = ["BackupAndRestore"]

log = logging.getLogger(__name__)


class BackupAndRestore(Callback):
    """Save ``{backup_dir}/backup.ckpt`` every ``save_freq`` epochs; restore it to resume.

    At a train epoch end with ``cur_epoch_num % save_freq == 0`` the train network's state
    (network, optimizer, loss scale) is written atomically with
    ``append_info = {"epoch_num": cur_epoch_num, "step_num": cur_step_num}``. At train end the
    file is deleted when ``delete_checkpoint`` is True; a run that dies keeps it.

    To resume, ``Model`` calls :meth:`restore` before training: it loads the backup into the
    train network and returns the epoch it was saved at, from which training continues. If
    :meth:`restore` was not called for the run, ``on_train_begin`` loads the weights (as
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

    def restore(self, train_network: Any) -> int:
        """Load the backup (if any) into ``train_network``; return the epoch it was saved at.

        Args:
            train_network: an object with ``load_checkpoint_state`` (or a ``torch.nn.Module``).

        Returns:
            The saved ``epoch_num`` (training resumes after it), or 0 when there is no backup.
        """
        self._restored = True
        if not os.path.isfile(self.backup_file):
            return 0
        log.info("Restoring the backup %s into the train network.", self.backup_file)
        state = load_checkpoint(self.backup_file, net=train_network)
        return int((state.get("append_info") or {}).get("epoch_num", 0))

    def on_train_begin(self, run_context: RunContext) -> None:
        """Load the backup unless :meth:`restore` already did for this run."""
        if self._restored:
            self._restored = False
            return
        if os.path.isfile(self.backup_file):
            cb = run_context.original_args()
            target = cb.get("train_network")
            if target is None:
                target = cb.get("network")
            log.info("Restoring the backup %s into the train network.", self.backup_file)
            load_checkpoint(self.backup_file, net=target)

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        """Write the backup every ``save_freq`` epochs (rank 0)."""
        cb = run_context.original_args()
        epoch = int(cb.get("cur_epoch_num", 0))
        if epoch % self.save_freq != 0 or not is_rank_zero(cb):
            return
        target = cb.get("train_network")
        if target is None:
            target = cb.get("network")
        save_checkpoint(
            target,
            self.backup_file,
            {"epoch_num": epoch, "step_num": int(cb.get("cur_step_num", 0))},
        )
        log.info("Backed up epoch %d to %s.", epoch, self.backup_file)

    def on_train_end(self, run_context: RunContext) -> None:
        """Delete the backup if ``delete_checkpoint`` (rank 0)."""
        self._restored = False
        cb = run_context.original_args()
        if self.delete_checkpoint and is_rank_zero(cb) and os.path.isfile(self.backup_file):
            os.chmod(self.backup_file, stat.S_IWRITE | stat.S_IREAD)
            os.remove(self.backup_file)
            log.info("Deleted the backup %s.", self.backup_file)
