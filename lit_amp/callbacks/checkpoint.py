"""MindSpore's ``ModelCheckpoint``: periodic checkpoints during training.

What and when to save is a :class:`~lit_amp.callbacks.checkpoint_config.CheckpointConfig`.
Each file is a Lightning checkpoint: the dict Lightning's ``Trainer.save_checkpoint`` writes
(built on every rank, so a strategy can gather sharded state) plus lit_amp's keys
(:mod:`lit_amp.serialization`). Rank 0 writes it atomically (in the background with
``async_save``, :class:`lit_amp._io.BackgroundJobs`) and, at the start of training, removes
the temp files a killed write of this callback left (:func:`lit_amp._io.remove_stale_temps`).
A file resumes with ``Trainer.fit(lit_model, ckpt_path=file)`` and loads with
``LitModel.load_from_checkpoint`` or :func:`lit_amp.load_checkpoint`.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import stat
import time
from collections.abc import Callable
from typing import Any

import torch

from lit_amp._io import BackgroundJobs, prune_newest, remove_stale_temps
from lit_amp.callbacks._utils import is_rank_zero
from lit_amp.callbacks.base import Callback, RunContext
from lit_amp.callbacks.checkpoint_config import CheckpointConfig
from lit_amp.serialization import checkpoint_payload, write_checkpoint

__all__ = ["CheckpointConfig", "ModelCheckpoint"]

log = logging.getLogger(__name__)

_BREAKPOINT_SUFFIX = "_breakpoint.ckpt"


def _changed_prefix(directory: str, prefix: str, exception: bool = False) -> str:
    """MindSpore's rule: ``prefix`` becomes ``prefix_{N}`` when its checkpoint files exist.

    ``N`` is one more than the largest suffix already used (``prefix-...`` counts as suffix 0).
    With ``exception=True`` only breakpoint files are considered, else only the other ``.ckpt``.
    """
    suffix_num = 0
    pre_len = len(prefix)
    try:
        files = os.listdir(directory)
    except OSError:
        return prefix
    for filename in files:
        is_breakpoint = filename.endswith(_BREAKPOINT_SUFFIX)
        if exception and not is_breakpoint:
            continue
        if not exception and (os.path.splitext(filename)[1] != ".ckpt" or is_breakpoint):
            continue
        if not filename.startswith(prefix) or len(filename) <= pre_len:
            continue
        if filename[pre_len].isalpha():
            continue
        index = filename[pre_len:].find("-")
        if index == 0:
            suffix_num = max(suffix_num, 1)
        elif index != -1:
            num = filename[pre_len + 1 : pre_len + index]
            if num.isdigit():
                suffix_num = max(suffix_num, int(num) + 1)
    return f"{prefix}_{suffix_num}" if suffix_num else prefix


class _CheckpointManager:
    """The checkpoint files of one prefix in one directory (MindSpore's ``CheckpointManager``)."""

    def __init__(self) -> None:
        self.files: list[str] = []
        self._order: dict[str, int] = {}
        self._counter = 0

    def note_saved(self, path: str) -> None:
        """Remember the save order (a tie-breaker for files with the same mtime)."""
        self._counter += 1
        self._order[path] = self._counter

    @staticmethod
    def _own(filename: str, prefix: str) -> bool:
        """Whether ``filename`` is ``{prefix}-{digits and _}.ckpt``."""
        if os.path.splitext(filename)[1] != ".ckpt" or not filename.startswith(prefix + "-"):
            return False
        return not any(ch.isalpha() for ch in filename[len(prefix) : -5])

    def update(self, directory: str, prefix: str) -> None:
        """List ``{prefix}-{digits and _}.ckpt`` files of ``directory``."""
        self.files = [os.path.join(directory, f) for f in os.listdir(directory)
                      if self._own(f, prefix)]

    def _key(self, path: str) -> tuple[int, int]:
        return os.stat(path).st_mtime_ns, self._order.get(path, 0)

    def remove(self, path: str) -> None:
        """Delete ``path`` (warning, not error, when that fails)."""
        try:
            os.chmod(path, stat.S_IWRITE | stat.S_IREAD)
            os.remove(path)
            self.files.remove(path)
        except (OSError, ValueError) as exc:
            log.warning("Failed to remove the older checkpoint file %s: %s", path, exc)

    def remove_oldest(self, directory: str, prefix: str) -> None:
        """Delete the file with the oldest modification time (MindSpore deletes one per save)."""
        if self.files:
            kept = prune_newest(directory, lambda f: self._own(f, prefix), len(self.files) - 1,
                                key=lambda f: self._key(os.path.join(directory, f)))
            self.files = [os.path.join(directory, f) for f in kept]

    def keep_one_per_minutes(self, minutes: int, cur_time: float) -> None:
        """Of the files written in the last ``minutes`` minutes, keep only the oldest."""
        recent = [f for f in self.files if cur_time - os.path.getmtime(f) < 60 * minutes]
        if not recent:
            return
        oldest = min(recent, key=self._key)
        for path in recent:
            if path != oldest:
                self.remove(path)


def _cpu_copy(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, _cpu_copy(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu_copy(v) for v in obj)
    return copy.deepcopy(obj)


class ModelCheckpoint(Callback):
    """Save checkpoints during training, as configured by a :class:`CheckpointConfig`.

    At each train step end it saves when ``cur_step_num >= last_saved_step +
    save_checkpoint_steps`` (so dataset sink mode, where ``cur_step_num`` jumps by the sink
    size, still saves), or in seconds mode when the interval has elapsed. At train end it saves
    once more unless that step was already saved. Files are named
    ``{prefix}-{cur_epoch_num}_{step_in_epoch}.ckpt`` in ``directory``; if checkpoint files with
    the same prefix already exist there, the prefix becomes ``{prefix}_{N}`` (not in a run that
    ``BackupAndRestore`` resumes: it keeps the prefix of its earlier start and counts
    ``save_checkpoint_steps`` from the run's start, see :meth:`load_state_dict`). When the number of
    files reaches ``keep_checkpoint_max`` the oldest is deleted before the next save.

    What is saved: ``cb_params.train_network`` (``Model``'s ``LitModel``: its Lightning
    checkpoint dict -- weights, optimizer, loops, callbacks, loss scale, boost) or
    ``config.saved_network`` (a plain module: a Lightning-shaped dict holding only
    ``state_dict``, under the module's own names, and ``append_info``). Reload with
    :func:`lit_amp.load_checkpoint`, ``LitModel.load_from_checkpoint`` or resume with
    ``Trainer.fit(..., ckpt_path=...)``. After each save it sets
    ``cb_params.latest_ckpt_file`` and ``cb_params.last_save_ckpt_step``.

    Every rank builds the checkpoint dict (gathering sharded state may be a collective); only
    global rank 0 writes or deletes files; every rank keeps the same bookkeeping.
    ``async_save`` copies the dict to the CPU, then writes it in a thread.

    Differences from MindSpore: no ``{prefix}-graph.meta`` file is written (a compiled graph has
    no PyTorch counterpart); the final save at train end happens in every save mode; the hooks
    are the train ones (``on_train_step_end``/``on_train_end``), so a stand-alone ``eval`` never
    writes checkpoints.

    A callable ``prefix`` (MindSpore 2.10's ``Union[str, callable]``) is called with
    ``cb_params`` at each train step end and must return a str without '/'; the file is then
    ``{prefix(cb_params)}.ckpt`` (no epoch and step: a constant prefix rewrites one file), the
    ``prefix_{N}`` rule and ``keep_checkpoint_max`` do not apply, and a breakpoint checkpoint
    is ``{prefix}-{cur_epoch_num}_{step_in_epoch}_breakpoint.ckpt`` with the prefix it last
    returned.

    Args:
        prefix: the file name prefix: a str without '/', or a callable
            ``(cb_params) -> str``.
        directory: the folder for the files (created if missing); None is the current working
            directory.
        config: a :class:`CheckpointConfig`; None uses the default (save every step, keep 5).

    Raises:
        ValueError: ``prefix`` is neither a callable nor a str without '/'; at a step end, a
            callable ``prefix`` returned something else.
        TypeError: ``directory`` is not a str path (MindSpore 2.10's type); ``config`` is not
            a :class:`CheckpointConfig`.

    Example:
        >>> import tempfile
        >>> ckpt_cb = ModelCheckpoint(prefix="lenet", directory=tempfile.mkdtemp(),
        ...                           config=CheckpointConfig(save_checkpoint_steps=100))
        >>> ckpt_cb.latest_ckpt_file_name
        ''
    """

    def __init__(
        self,
        prefix: str | Callable[[Any], str] = "CKP",
        directory: str | os.PathLike | None = None,
        config: CheckpointConfig | None = None,
    ) -> None:
        super().__init__()
        self._prefix_func = prefix if callable(prefix) else None
        if self._prefix_func is None and (
            not isinstance(prefix, str) or "/" in prefix or os.sep in prefix or not prefix
        ):
            raise ValueError(
                "For 'ModelCheckpoint', the argument 'prefix' must be a non-empty str without "
                f"'/', but got {prefix!r}."
            )
        if directory is None:
            directory = os.getcwd()
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(  # MindSpore 2.10's type
                "For 'ModelCheckpoint', the argument 'directory' must be a str path or None, but "
                f"got {directory!r} of type {type(directory).__name__}."
            )
        self._directory = os.path.abspath(os.fspath(directory))
        os.makedirs(self._directory, exist_ok=True)
        if config is None:
            config = CheckpointConfig()
        elif not isinstance(config, CheckpointConfig):
            raise TypeError(
                "For 'ModelCheckpoint', the argument 'config' must be a CheckpointConfig or None, "
                f"but got {type(config).__name__}."
            )
        self._config = config
        # this callback's file names, whatever prefix_N MindSpore's rule picks (temps of a
        # killed write are removed at train begin)
        if self._prefix_func is None:
            self._own_files: re.Pattern[str] | None = re.compile(
                rf"{re.escape(prefix)}(_\d+)?-\d+_\d+(_breakpoint)?\.ckpt")
            self._prefix = _changed_prefix(self._directory, prefix)
            self._exception_prefix = _changed_prefix(self._directory, prefix, exception=True)
        else:  # names known only once it is called
            self._own_files = None
            self._prefix = self._exception_prefix = ""

        self._manager = _CheckpointManager()
        self._append_dict: dict[str, Any] = dict(config.append_dict or {})
        self._append_epoch_num = self._append_dict.get("epoch_num", 0)
        self._append_step_num = self._append_dict.get("step_num", 0)
        self._latest_ckpt_file_name = ""
        self._last_triggered_step = 0
        self._steps_before = 0  # the run's steps before this call (initial_epoch x batch_num)
        self._run_state: dict | None = None  # load_state_dict's, until the run begins
        self._in_run = False
        self._last_time = time.time()
        self._last_time_for_keep = time.time()
        self._writes = BackgroundJobs("lit_amp_async_save_ckpt")  # async_save's

    @property
    def latest_ckpt_file_name(self) -> str:
        """The path of the latest checkpoint written ('' before the first)."""
        return self._latest_ckpt_file_name

    @property
    def config(self) -> CheckpointConfig:
        """The :class:`CheckpointConfig` in use (``Model`` reads ``config.exception_save``)."""
        return self._config

    @property
    def prefix(self) -> str:
        """The file prefix actually used (``prefix_{N}`` when files with the prefix existed; for a
        callable ``prefix``, what it last returned, '' before the first step)."""
        return self._prefix

    @property
    def directory(self) -> str:
        """The absolute folder the files go to."""
        return self._directory

    def on_train_begin(self, run_context: RunContext) -> None:
        """Start the clocks and the step counter of this run; on rank 0 remove the temp files
        a killed write of this callback left in ``directory``."""
        if self._own_files is not None and is_rank_zero(run_context.original_args()):
            own = self._own_files
            removed = remove_stale_temps(
                self._directory, lambda name: own.fullmatch(name) is not None)
            if removed:
                log.info("ModelCheckpoint: removed %d temp file(s) of an interrupted write: %s",
                         len(removed), ", ".join(os.path.basename(p) for p in removed))
        cb_params = run_context.original_args()
        self._steps_before = (int(cb_params.get("initial_epoch", 0) or 0)
                              * int(cb_params.get("batch_num", 0) or 0))
        self._last_triggered_step = 0
        self._last_time = time.time()
        self._last_time_for_keep = time.time()
        self._in_run = True
        if self._run_state is not None:
            self._continue_run()

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on with this run's files (``BackupAndRestore``
        saves it in its backup): the directory, the prefix in use and the run's step
        (``initial_epoch * batch_num + cur_step_num``) of the last step-triggered save.

        Example:
            >>> import tempfile
            >>> ModelCheckpoint("net", tempfile.mkdtemp()).state_dict()["prefix"]
            'net'
        """
        return {"directory": self._directory, "prefix": self._prefix,
                "exception_prefix": self._exception_prefix,
                "last_triggered_step": self._steps_before + self._last_triggered_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the run of :meth:`state_dict` (``BackupAndRestore`` calls it when it
        resumes the run): a file this run writes keeps the prefix the earlier start used (not
        MindSpore's ``prefix_{N}`` for a new run), and ``save_checkpoint_steps`` counts from
        the run's start. A state of another directory or prefix is ignored. Applied at train
        begin (or at once when the run has begun)."""
        self._run_state = dict(state)
        if self._in_run:
            self._continue_run()

    def _continue_run(self) -> None:
        state, self._run_state = self._run_state or {}, None
        if state.get("directory") != self._directory:
            return
        own = self._own_files
        for attr, key in (("_prefix", "prefix"), ("_exception_prefix", "exception_prefix")):
            prefix = state.get(key)
            if own is not None and isinstance(prefix, str) and own.fullmatch(f"{prefix}-1_1.ckpt"):
                setattr(self, attr, prefix)
        self._last_triggered_step = int(state.get("last_triggered_step", 0)) - self._steps_before

    def on_train_step_end(self, run_context: RunContext) -> None:
        """Call a callable ``prefix``, then save a checkpoint if the step or time trigger fired."""
        cb_params = run_context.original_args()
        if self._prefix_func is not None:
            self._prefix = self._exception_prefix = self._call_prefix(cb_params)
        self._save_ckpt(cb_params)

    def on_train_end(self, run_context: RunContext) -> None:
        """Save the last checkpoint unless this step was saved already, then wait for writes."""
        self._in_run = False
        self._save_ckpt(run_context.original_args(), force_to_save=True)
        self._join()

    def save_breakpoint(self, cb_params: dict) -> str | None:
        """Save ``{prefix}-{cur_epoch}_{step_in_epoch}_breakpoint.ckpt`` now (``Model`` calls it
        when training raises and ``config.exception_save`` is True).

        Args:
            cb_params: the run's callback parameters.

        Returns:
            The path written, or None on ranks other than 0.
        """
        self._join()
        epoch, step_in_epoch = self._epoch_and_step(cb_params)
        if self._prefix_func is not None and not self._exception_prefix:  # before any step end
            self._exception_prefix = self._call_prefix(cb_params)
        name = f"{self._exception_prefix}-{epoch}_{step_in_epoch}{_BREAKPOINT_SUFFIX}"
        path = os.path.join(self._directory, name)
        if not is_rank_zero(cb_params):
            return None
        if _is_sharded(self._save_obj(cb_params)):
            # gathering a sharded (FSDP2) state is a collective, and the other ranks may be
            # elsewhere when one fails: writing would hang
            log.warning("ModelCheckpoint: no breakpoint checkpoint under sharded training "
                        "(FSDP2): gathering the state needs every rank. The last periodic "
                        "checkpoint (%s) is the one to resume from.",
                        self._latest_ckpt_file_name or "none yet")
            return None
        # rank 0 alone (the other ranks may be elsewhere when one fails): no collective here
        write_checkpoint(checkpoint_payload(self._save_obj(cb_params),
                                            self._current_append(cb_params)), path)
        log.info("Saved the breakpoint checkpoint %s.", path)
        return path

    # internals
    def _call_prefix(self, cb_params: dict) -> str:
        assert self._prefix_func is not None
        prefix = self._prefix_func(cb_params)
        if not isinstance(prefix, str) or "/" in prefix or os.sep in prefix or not prefix:
            raise ValueError(  # MindSpore 2.10's type and wording
                "For 'ModelCheckpoint', the argument 'prefix' for checkpoint file name is "
                "callable, it must return a non-empty string that does not contain '/', but got "
                f"{prefix!r}."
            )
        return prefix

    @staticmethod
    def _epoch_and_step(cb_params: dict) -> tuple[int, int]:
        cur_step = int(cb_params.get("cur_step_num", 0))
        batch_num = int(cb_params.get("batch_num", 0) or 0)
        step_in_epoch = (cur_step - 1) % batch_num + 1 if batch_num > 0 else cur_step
        return int(cb_params.get("cur_epoch_num", 1)), step_in_epoch

    def _save_obj(self, cb_params: dict) -> Any:
        if self._config.saved_network is not None:
            return self._config.saved_network
        obj = cb_params.get("train_network")
        return obj if obj is not None else cb_params.get("network")

    def _current_append(self, cb_params: dict) -> dict[str, Any]:
        if "epoch_num" in self._append_dict:
            self._append_dict["epoch_num"] = self._append_epoch_num + cb_params.get(
                "cur_epoch_num", 0
            )
        if "step_num" in self._append_dict:
            self._append_dict["step_num"] = self._append_step_num + cb_params.get("cur_step_num", 0)
        return dict(self._append_dict)

    def _check_save_ckpt(self, cb_params: dict, force_to_save: bool) -> bool:
        steps = self._config.save_checkpoint_steps
        seconds = self._config.save_checkpoint_seconds
        if steps and steps > 0:
            return force_to_save or cb_params.get("cur_step_num", 0) >= (
                self._last_triggered_step + steps
            )
        if seconds and seconds > 0:
            now = time.time()
            if now - self._last_time > seconds or force_to_save:
                self._last_time = now
                return True
            return False
        return force_to_save

    def _join(self) -> None:
        """Wait for the asynchronous save in flight (its thread stops); raise its error."""
        try:
            self._writes.close()
        except BaseException as err:
            raise RuntimeError(f"ModelCheckpoint: an asynchronous save failed: {err}") from err

    def _save_ckpt(self, cb_params: dict, force_to_save: bool = False) -> None:
        cur_step = cb_params.get("cur_step_num", 0)
        if cur_step == self._last_triggered_step:
            return
        if not self._check_save_ckpt(cb_params, force_to_save):
            return
        self._join()
        epoch, step_in_epoch = self._epoch_and_step(cb_params)
        name = (f"{self._prefix}.ckpt" if self._prefix_func is not None
                else f"{self._prefix}-{epoch}_{step_in_epoch}.ckpt")
        path = os.path.join(self._directory, name)
        rank_zero = is_rank_zero(cb_params)
        if rank_zero:
            os.makedirs(self._directory, exist_ok=True)
            self._manager.update(self._directory, self._prefix)
            keep_max = self._config.keep_checkpoint_max
            keep_minutes = self._config.keep_checkpoint_per_n_minutes
            if keep_max and 0 < keep_max <= len(self._manager.files):
                self._manager.remove_oldest(self._directory, self._prefix)
            elif keep_minutes and keep_minutes > 0:
                now = time.time()
                if now - self._last_time_for_keep < keep_minutes * 60:
                    self._manager.keep_one_per_minutes(keep_minutes, now)
        self._last_time_for_keep = time.time()
        self._last_triggered_step = cur_step
        # built on every rank: the strategy may gather sharded state (a collective)
        payload = checkpoint_payload(self._save_obj(cb_params), self._current_append(cb_params))
        if rank_zero:
            if self._config.async_save:
                self._writes.submit(write_checkpoint, _cpu_copy(payload), path)
            else:
                write_checkpoint(payload, path)
            self._manager.note_saved(path)
        self._latest_ckpt_file_name = path
        cb_params["latest_ckpt_file"] = path
        cb_params["last_save_ckpt_step"] = cur_step


def _is_sharded(obj: Any) -> bool:
    """Whether ``obj`` is a module with FSDP2-sharded (``DTensor``) parameters."""
    if not isinstance(obj, torch.nn.Module):
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in obj.parameters())
