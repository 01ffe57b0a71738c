"""MindSpore's ``CheckpointConfig`` and ``ModelCheckpoint``: periodic checkpoints during training.

Checkpoints are written with :func:`lit_amp.checkpoint_io.save_checkpoint` (a ``torch.save``d
dict holding the network's state dict, the optimizer state and the loss-scale state).
"""

from __future__ import annotations

import copy
import logging
import os
import stat
import threading
import time
from typing import Any

import torch

from lit_amp.callbacks._builtin_utils import check_bool, check_int, check_str, is_rank_zero
from lit_amp.callbacks._callback import Callback, RunContext
from lit_amp.checkpoint_io import save_checkpoint

__all__ = ["CheckpointConfig", "ModelCheckpoint"]

log = logging.getLogger(__name__)

_INFO_LIST = ("epoch_num", "step_num")
_ENC_MODES = ("AES-GCM", "AES-CBC", "SM4-CBC")
_KNOWN_KWARGS = ("incremental", "crc_check", "remove_redundancy", "format")
_FORMATS = ("ckpt",)
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


class CheckpointConfig:
    """How often :class:`ModelCheckpoint` saves, how many files it keeps, and what it saves.

    Save triggers: every ``save_checkpoint_steps`` steps, or (when that is 0 or None) every
    ``save_checkpoint_seconds`` seconds. Keep policy: at most ``keep_checkpoint_max`` files, or
    (when that is 0 or None) one file per ``keep_checkpoint_per_n_minutes`` minutes; when both
    keep options are 0 or None, ``keep_checkpoint_max`` becomes 1.

    Args:
        save_checkpoint_steps: save every this many steps (non-negative int or None).
        save_checkpoint_seconds: save every this many seconds; ignored when
            ``save_checkpoint_steps`` > 0 (non-negative int or None).
        keep_checkpoint_max: keep at most this many files (non-negative int or None).
        keep_checkpoint_per_n_minutes: keep one file per this many minutes; ignored when
            ``keep_checkpoint_max`` > 0 (non-negative int or None).
        integrated_save: accepted for compatibility (merging split tensors of MindSpore's
            automatic parallelism); state dicts are always saved whole.
        async_save: write the file in a background thread from a CPU snapshot of the state.
        saved_network: a ``torch.nn.Module`` to save instead of the train network (then the
            optimizer state is not saved).
        append_info: a list of ``"epoch_num"``, ``"step_num"`` and at most one dict
            ``{str: int | float | bool | str | torch.Tensor}``, stored in the checkpoint's
            ``"append_info"``.
        enc_key: must be None: lit_amp checkpoints are not encrypted (encrypt the files with
            your own tooling); a key raises ValueError rather than silently saving plain text.
        enc_mode: one of 'AES-GCM', 'AES-CBC', 'SM4-CBC' (checked, unused without a key).
        exception_save: whether ``Model`` saves a ``*_breakpoint.ckpt`` when training raises.
        **kwargs: MindSpore's extra options ``incremental``, ``crc_check``,
            ``remove_redundancy`` (bools, accepted and unused) and ``format`` (only ``"ckpt"``).

    Raises:
        TypeError: a count is not an int; a flag is not a bool; ``saved_network`` is not a
            module; ``append_info`` is not a list of str and dicts, holds two dicts, or its
            dict has a non-str key or an unsupported value; ``enc_key`` is not bytes or None;
            ``enc_mode`` is not a str; an unknown keyword argument.
        ValueError: a count is negative; all four counts are 0 or None; an ``append_info``
            string is not "epoch_num" or "step_num"; ``enc_key`` is given; ``enc_mode`` or
            ``format`` is not an allowed value.

    Example:
        >>> config = CheckpointConfig(save_checkpoint_steps=100, keep_checkpoint_max=3,
        ...                           append_info=["epoch_num", {"lr": 0.01}])
        >>> config.save_checkpoint_steps, config.save_checkpoint_seconds
        (100, None)
        >>> config.append_dict
        {'epoch_num': 0, 'lr': 0.01}
    """

    def __init__(
        self,
        save_checkpoint_steps: int | None = 1,
        save_checkpoint_seconds: int | None = 0,
        keep_checkpoint_max: int | None = 5,
        keep_checkpoint_per_n_minutes: int | None = 0,
        integrated_save: bool = True,
        async_save: bool = False,
        saved_network: torch.nn.Module | None = None,
        append_info: list[str | dict[str, Any]] | None = None,
        enc_key: bytes | None = None,
        enc_mode: str = "AES-GCM",
        exception_save: bool = False,
        **kwargs: Any,
    ) -> None:
        owner = "CheckpointConfig"
        steps = check_int(
            owner, "save_checkpoint_steps", save_checkpoint_steps, minimum=0, allow_none=True
        )
        seconds = check_int(
            owner, "save_checkpoint_seconds", save_checkpoint_seconds, minimum=0, allow_none=True
        )
        keep_max = check_int(
            owner, "keep_checkpoint_max", keep_checkpoint_max, minimum=0, allow_none=True
        )
        keep_minutes = check_int(
            owner,
            "keep_checkpoint_per_n_minutes",
            keep_checkpoint_per_n_minutes,
            minimum=0,
            allow_none=True,
        )
        if saved_network is not None and not isinstance(saved_network, torch.nn.Module):
            raise TypeError(
                f"For '{owner}', the argument 'saved_network' must be None or a torch.nn.Module, "
                f"but got {type(saved_network).__name__}."
            )
        if not steps and not seconds and not keep_max and not keep_minutes:
            raise ValueError(
                f"For '{owner}', the arguments 'save_checkpoint_steps' ({steps}), "
                f"'save_checkpoint_seconds' ({seconds}), 'keep_checkpoint_max' ({keep_max}) and "
                f"'keep_checkpoint_per_n_minutes' ({keep_minutes}) can't all be None or 0."
            )
        self.exception_save = check_bool(owner, "exception_save", exception_save)

        self._save_checkpoint_steps = steps
        self._save_checkpoint_seconds = seconds
        if steps and steps > 0:
            self._save_checkpoint_seconds = None

        self._keep_checkpoint_max = keep_max
        self._keep_checkpoint_per_n_minutes = keep_minutes
        if keep_max and keep_max > 0:
            self._keep_checkpoint_per_n_minutes = None
        elif not keep_minutes:
            self._keep_checkpoint_max = 1

        self._integrated_save = check_bool(owner, "integrated_save", integrated_save)
        self._async_save = check_bool(owner, "async_save", async_save)
        self._saved_network = saved_network
        self._append_dict = self._handle_append_info(append_info)

        if enc_key is not None and not isinstance(enc_key, bytes):
            raise TypeError(
                f"For '{owner}', the argument 'enc_key' must be None or bytes, but got "
                f"{type(enc_key).__name__}."
            )
        if enc_key is not None:
            raise ValueError(
                f"For '{owner}', the argument 'enc_key' must be None: lit_amp writes plain "
                "torch.save checkpoints and does not encrypt them; encrypt the files with your "
                "own tooling instead of relying on an unencrypted save."
            )
        self._enc_key = enc_key
        check_str(owner, "enc_mode", enc_mode)
        if enc_mode not in _ENC_MODES:
            raise ValueError(
                f"For '{owner}', the argument 'enc_mode' must be one of {list(_ENC_MODES)}, "
                f"but got {enc_mode!r}."
            )
        self._enc_mode = enc_mode

        unknown = sorted(set(kwargs) - set(_KNOWN_KWARGS))
        if unknown:
            raise TypeError(
                f"For '{owner}', got unexpected keyword argument(s) {unknown}; the allowed extra "
                f"keyword arguments are {list(_KNOWN_KWARGS)}."
            )
        for key in ("incremental", "crc_check", "remove_redundancy"):
            if key in kwargs:
                check_bool(owner, key, kwargs[key])
        fmt = kwargs.get("format", "ckpt")
        check_str(owner, "format", fmt)
        if fmt not in _FORMATS:
            raise ValueError(
                f"For '{owner}', the argument 'format' must be one of {list(_FORMATS)}, "
                f"but got {fmt!r}."
            )
        self._map_param_inc = bool(kwargs.get("incremental", False))
        self._crc_check = bool(kwargs.get("crc_check", False))
        self._remove_redundancy = bool(kwargs.get("remove_redundancy", False))
        self._format = fmt

    @property
    def save_checkpoint_steps(self) -> int | None:
        """Steps between two saves (0 or None: save by seconds)."""
        return self._save_checkpoint_steps

    @property
    def save_checkpoint_seconds(self) -> int | None:
        """Seconds between two saves (None when ``save_checkpoint_steps`` > 0)."""
        return self._save_checkpoint_seconds

    @property
    def keep_checkpoint_max(self) -> int | None:
        """Maximum number of checkpoint files kept."""
        return self._keep_checkpoint_max

    @property
    def keep_checkpoint_per_n_minutes(self) -> int | None:
        """Keep one file per this many minutes (None when ``keep_checkpoint_max`` > 0)."""
        return self._keep_checkpoint_per_n_minutes

    @property
    def integrated_save(self) -> bool:
        """Accepted for compatibility; state dicts are always saved whole."""
        return self._integrated_save

    @property
    def async_save(self) -> bool:
        """Whether files are written by a background thread."""
        return self._async_save

    @property
    def saved_network(self) -> torch.nn.Module | None:
        """The module saved instead of the train network, or None."""
        return self._saved_network

    @property
    def enc_key(self) -> bytes | None:
        """Always None (encryption is not supported)."""
        return self._enc_key

    @property
    def enc_mode(self) -> str:
        """The encryption mode name (unused)."""
        return self._enc_mode

    @property
    def append_dict(self) -> dict[str, Any] | None:
        """The extra information stored in each checkpoint, or None."""
        return self._append_dict

    @property
    def map_param_inc(self) -> bool:
        """MindSpore's ``incremental`` option (accepted, unused)."""
        return self._map_param_inc

    def get_checkpoint_policy(self) -> dict[str, Any]:
        """The save and keep policy as a dict.

        Example:
            >>> CheckpointConfig().get_checkpoint_policy()["keep_checkpoint_max"]
            5
        """
        return {
            "save_checkpoint_steps": self.save_checkpoint_steps,
            "save_checkpoint_seconds": self.save_checkpoint_seconds,
            "keep_checkpoint_max": self.keep_checkpoint_max,
            "keep_checkpoint_per_n_minutes": self.keep_checkpoint_per_n_minutes,
            "saved_network": self.saved_network,
        }

    @staticmethod
    def _handle_append_info(append_info: Any) -> dict[str, Any] | None:
        owner = "CheckpointConfig"
        if append_info is None or (isinstance(append_info, list) and not append_info):
            return None
        if not isinstance(append_info, list):
            raise TypeError(
                f"For '{owner}', the argument 'append_info' must be a list or None, but got "
                f"{type(append_info).__name__}."
            )
        result: dict[str, Any] = {}
        for name in _INFO_LIST:
            if name in append_info:
                result[name] = 0
        dict_num = 0
        for element in append_info:
            if isinstance(element, str):
                if element not in _INFO_LIST:
                    raise ValueError(
                        f"For '{owner}', a string in the argument 'append_info' must be one of "
                        f"{list(_INFO_LIST)}, but got {element!r}."
                    )
            elif isinstance(element, dict):
                dict_num += 1
                if dict_num > 1:
                    raise TypeError(
                        f"For '{owner}', the argument 'append_info' may hold at most one dict, "
                        f"but got {dict_num}."
                    )
                for key, value in element.items():
                    if not isinstance(key, str) or not isinstance(
                        value, (int, float, bool, str, torch.Tensor)
                    ):
                        raise TypeError(
                            f"For '{owner}', the dict in the argument 'append_info' must map str "
                            "to int, float, bool, str or torch.Tensor, but got key "
                            f"{key!r} ({type(key).__name__}) with a value of type "
                            f"{type(value).__name__}."
                        )
                    result[key] = value
            else:
                raise TypeError(
                    f"For '{owner}', the elements of the argument 'append_info' must be str or "
                    f"dict, but got {element!r} of type {type(element).__name__}."
                )
        return result


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

    def update(self, directory: str, prefix: str) -> None:
        """List ``{prefix}-{digits and _}.ckpt`` files of ``directory``."""
        self.files = []
        for filename in os.listdir(directory):
            if os.path.splitext(filename)[1] != ".ckpt" or not filename.startswith(prefix + "-"):
                continue
            mid = filename[len(prefix) : -5]
            if not any(ch.isalpha() for ch in mid):
                self.files.append(os.path.join(directory, filename))

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

    def remove_oldest(self) -> None:
        """Delete the file with the oldest modification time."""
        if self.files:
            self.remove(min(self.files, key=self._key))

    def keep_one_per_minutes(self, minutes: int, cur_time: float) -> None:
        """Of the files written in the last ``minutes`` minutes, keep only the oldest."""
        recent = [f for f in self.files if cur_time - os.path.getmtime(f) < 60 * minutes]
        if not recent:
            return
        oldest = min(recent, key=self._key)
        for path in recent:
            if path != oldest:
                self.remove(path)


class _StateSnapshot:
    """A frozen ``checkpoint_state()`` (CPU copies) for asynchronous saving."""

    def __init__(self, state: dict) -> None:
        self._state = state

    def checkpoint_state(self) -> dict:
        return self._state


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
    the same prefix already exist there, the prefix becomes ``{prefix}_{N}``. When the number of
    files reaches ``keep_checkpoint_max`` the oldest is deleted before the next save.

    What is saved: ``cb_params.train_network`` (an object with ``checkpoint_state()``: network,
    optimizer and loss-scale state) or ``config.saved_network``. Reload with
    :func:`lit_amp.checkpoint_io.load_checkpoint`. After each save it sets
    ``cb_params.latest_ckpt_file`` and ``cb_params.last_save_ckpt_step``.

    Only global rank 0 writes or deletes files; every rank keeps the same bookkeeping.

    Differences from MindSpore: no ``{prefix}-graph.meta`` file is written (a compiled graph has
    no PyTorch counterpart); the final save at train end happens in every save mode; the hooks
    are the train ones (``on_train_step_end``/``on_train_end``), so a stand-alone ``eval`` never
    writes checkpoints.

    Args:
        prefix: the file name prefix; a str without '/'.
        directory: the folder for the files (created if missing); None is the current working
            directory.
        config: a :class:`CheckpointConfig`; None uses the default (save every step, keep 5).

    Raises:
        ValueError: ``prefix`` is not a str or contains '/'; ``directory`` is not a str path.
        TypeError: ``config`` is not a :class:`CheckpointConfig`.

    Example:
        >>> import tempfile
        >>> ckpt_cb = ModelCheckpoint(prefix="lenet", directory=tempfile.mkdtemp(),
        ...                           config=CheckpointConfig(save_checkpoint_steps=100))
        >>> ckpt_cb.latest_ckpt_file_name
        ''
    """

    def __init__(
        self,
        prefix: str = "CKP",
        directory: str | os.PathLike | None = None,
        config: CheckpointConfig | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(prefix, str) or "/" in prefix or os.sep in prefix or not prefix:
            raise ValueError(
                "For 'ModelCheckpoint', the argument 'prefix' must be a non-empty str without "
                f"'/', but got {prefix!r}."
            )
        if directory is None:
            directory = os.getcwd()
        if not isinstance(directory, (str, os.PathLike)):
            raise ValueError(
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
        self._prefix = _changed_prefix(self._directory, prefix)
        self._exception_prefix = _changed_prefix(self._directory, prefix, exception=True)
        self._manager = _CheckpointManager()
        self._append_dict: dict[str, Any] = dict(config.append_dict or {})
        self._append_epoch_num = self._append_dict.get("epoch_num", 0)
        self._append_step_num = self._append_dict.get("step_num", 0)
        self._latest_ckpt_file_name = ""
        self._last_triggered_step = 0
        self._last_time = time.time()
        self._last_time_for_keep = time.time()
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None

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
        """The file prefix actually used (``prefix_{N}`` when files with the prefix existed)."""
        return self._prefix

    @property
    def directory(self) -> str:
        """The absolute folder the files go to."""
        return self._directory

    def on_train_begin(self, run_context: RunContext) -> None:
        """Start the clocks and the step counter of this run."""
        self._last_triggered_step = 0
        self._last_time = time.time()
        self._last_time_for_keep = time.time()

    def on_train_step_end(self, run_context: RunContext) -> None:
        """Save a checkpoint if the step or time trigger fired."""
        self._save_ckpt(run_context.original_args())

    def on_train_end(self, run_context: RunContext) -> None:
        """Save the last checkpoint unless this step was saved already, then wait for writes."""
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
        name = f"{self._exception_prefix}-{epoch}_{step_in_epoch}{_BREAKPOINT_SUFFIX}"
        path = os.path.join(self._directory, name)
        if not is_rank_zero(cb_params):
            return None
        save_checkpoint(self._save_obj(cb_params), path, self._current_append(cb_params))
        log.info("Saved the breakpoint checkpoint %s.", path)
        return path

    # internals
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
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._thread_error is not None:
            err, self._thread_error = self._thread_error, None
            raise RuntimeError(f"ModelCheckpoint: an asynchronous save failed: {err}") from err

    def _save_ckpt(self, cb_params: dict, force_to_save: bool = False) -> None:
        cur_step = cb_params.get("cur_step_num", 0)
        if cur_step == self._last_triggered_step:
            return
        if not self._check_save_ckpt(cb_params, force_to_save):
            return
        self._join()
        epoch, step_in_epoch = self._epoch_and_step(cb_params)
        path = os.path.join(self._directory, f"{self._prefix}-{epoch}_{step_in_epoch}.ckpt")
        rank_zero = is_rank_zero(cb_params)
        if rank_zero:
            os.makedirs(self._directory, exist_ok=True)
            self._manager.update(self._directory, self._prefix)
            keep_max = self._config.keep_checkpoint_max
            keep_minutes = self._config.keep_checkpoint_per_n_minutes
            if keep_max and 0 < keep_max <= len(self._manager.files):
                self._manager.remove_oldest()
            elif keep_minutes and keep_minutes > 0:
                now = time.time()
                if now - self._last_time_for_keep < keep_minutes * 60:
                    self._manager.keep_one_per_minutes(keep_minutes, now)
        self._last_time_for_keep = time.time()
        self._last_triggered_step = cur_step
        append = self._current_append(cb_params)
        if rank_zero:
            obj = self._save_obj(cb_params)
            if self._config.async_save:
                snapshot = _StateSnapshot(_cpu_copy(_state_dict_of(obj)))
                self._thread = threading.Thread(
                    target=self._async_write,
                    args=(snapshot, path, append),
                    name="lit_amp_async_save_ckpt",
                    daemon=False,
                )
                self._thread.start()
            else:
                save_checkpoint(obj, path, append)
            self._manager.note_saved(path)
        self._latest_ckpt_file_name = path
        cb_params["latest_ckpt_file"] = path
        cb_params["last_save_ckpt_step"] = cur_step

    def _async_write(self, snapshot: _StateSnapshot, path: str, append: dict) -> None:
        try:
            save_checkpoint(snapshot, path, append)
        except BaseException as exc:  # re-raised in the training thread by _join
            self._thread_error = exc


def _state_dict_of(obj: Any) -> dict:
    if hasattr(obj, "checkpoint_state"):
        return dict(obj.checkpoint_state())
    if isinstance(obj, torch.nn.Module):
        return {"network": obj.state_dict()}
    raise TypeError(
        "ModelCheckpoint: the object to save must be a torch.nn.Module or have "
        f"checkpoint_state(), but got {type(obj).__name__}."
    )
