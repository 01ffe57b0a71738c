"""MindSpore's ``CheckpointConfig``: when :class:`ModelCheckpoint` saves, what it keeps and saves.

A frozen dataclass: the constructor keeps MindSpore's keyword names, defaults and exception
types; ``__post_init__`` validates (messages from :mod:`lit_amp._validation`) and applies
MindSpore's precedence rules between the save triggers and the keep policies.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import torch

from lit_amp._validation import (
    check_bool,
    check_choice,
    check_int,
    check_type,
    value_error,
)
from lit_amp.serialization import RESERVED_KEYS

__all__ = ["CheckpointConfig"]

_INFO_LIST = ("epoch_num", "step_num")
_ENC_MODES = ("AES-GCM", "AES-CBC", "SM4-CBC")
_COUNT_FIELDS = (
    "save_checkpoint_steps",
    "save_checkpoint_seconds",
    "keep_checkpoint_max",
    "keep_checkpoint_per_n_minutes",
)
_FLAG_FIELDS = (
    "exception_save",
    "integrated_save",
    "async_save",
    "incremental",
    "crc_check",
    "remove_redundancy",
)
_INFO_VALUE_TYPES = (int, float, bool, str, torch.Tensor)
_FORMATS = ("ckpt",)
#: the flags whose non-bool value MindSpore 2.10 refuses with a ValueError, not a TypeError
_VALUE_ERROR_FLAGS = ("remove_redundancy", "crc_check")


def _append_dict(append_info: Any) -> dict[str, Any] | None:
    """``CheckpointConfig.append_info`` checked and turned into the dict stored in each file."""
    owner = "CheckpointConfig"
    if append_info is None or (isinstance(append_info, list) and not append_info):
        return None
    check_type(owner, "append_info", append_info, list, "a list", allow_none=True)
    result: dict[str, Any] = {name: 0 for name in _INFO_LIST if name in append_info}
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
                if not isinstance(key, str) or not isinstance(value, _INFO_VALUE_TYPES):
                    raise TypeError(
                        f"For '{owner}', the dict in the argument 'append_info' must map str "
                        "to int, float, bool, str or torch.Tensor, but got key "
                        f"{key!r} ({type(key).__name__}) with a value of type "
                        f"{type(value).__name__}."
                    )
                if key in RESERVED_KEYS:
                    raise ValueError(
                        f"For '{owner}', the dict in the argument 'append_info' may not use the "
                        f"key {key!r}: load_checkpoint returns each entry as a key of its own, "
                        "and that one names an entry of the checkpoint dict."
                    )
                result[key] = value
        else:
            raise TypeError(
                f"For '{owner}', the elements of the argument 'append_info' must be str or "
                f"dict, but got {element!r} of type {type(element).__name__}."
            )
    return result


@dataclass(frozen=True, eq=False)
class CheckpointConfig:
    """How often :class:`ModelCheckpoint` saves, how many files it keeps, and what it saves.

    Save triggers: every ``save_checkpoint_steps`` steps, or (when that is 0 or None) every
    ``save_checkpoint_seconds`` seconds. Keep policy: at most ``keep_checkpoint_max`` files, or
    (when that is 0 or None) one file per ``keep_checkpoint_per_n_minutes`` minutes; when both
    keep options are 0 or None, ``keep_checkpoint_max`` becomes 1. The fields hold these
    normalised values (``save_checkpoint_seconds`` is None when ``save_checkpoint_steps`` > 0,
    ``keep_checkpoint_per_n_minutes`` is None when ``keep_checkpoint_max`` > 0). The config is
    immutable (frozen) and compares by identity, like MindSpore's.

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
        saved_network: a ``torch.nn.Module`` to save instead of the train network: the file
            is then a Lightning-shaped dict holding only ``state_dict`` (under the module's
            own names) and ``append_info`` (no optimizer, loops or loss scale: not resumable).
        append_info: a list of ``"epoch_num"``, ``"step_num"`` and at most one dict
            ``{str: int | float | bool | str | torch.Tensor}``, stored in the checkpoint's
            ``"append_info"`` (see :attr:`append_dict`).
        enc_key: must be None: lit_amp checkpoints are not encrypted (encrypt the files with
            your own tooling); a key raises ValueError rather than silently saving plain text.
        enc_mode: one of 'AES-GCM', 'AES-CBC', 'SM4-CBC' (checked, unused without a key).
        exception_save: whether ``Model`` saves a ``*_breakpoint.ckpt`` when training raises.
        incremental, crc_check, remove_redundancy: MindSpore's extra keyword options (bools,
            accepted and unused).
        format: MindSpore's extra keyword option; only ``"ckpt"``.

    Raises:
        TypeError: a count is not an int; a flag (but ``remove_redundancy`` and ``crc_check``)
            is not a bool;
            ``saved_network`` is not a module; ``append_info`` is not a list of str and dicts,
            holds two dicts, or its dict has a non-str key or an unsupported value;
            an unknown keyword argument.
        ValueError: a count is negative; all four counts are 0 or None; an ``append_info``
            string is not "epoch_num" or "step_num"; ``enc_key`` is given (any type, as
            MindSpore 2.10); ``remove_redundancy`` or ``crc_check`` is not a bool, ``enc_mode``
            or ``format`` not a str (MindSpore 2.10's type for these); ``enc_mode`` or
            ``format`` is not an allowed value.

    Example:
        >>> config = CheckpointConfig(save_checkpoint_steps=100, keep_checkpoint_max=3,
        ...                           append_info=["epoch_num", {"lr": 0.01}])
        >>> config.save_checkpoint_steps, config.save_checkpoint_seconds
        (100, None)
        >>> config.append_dict
        {'epoch_num': 0, 'lr': 0.01}
    """

    save_checkpoint_steps: int | None = 1
    save_checkpoint_seconds: int | None = 0
    keep_checkpoint_max: int | None = 5
    keep_checkpoint_per_n_minutes: int | None = 0
    integrated_save: bool = True
    async_save: bool = False
    saved_network: torch.nn.Module | None = field(default=None, repr=False)
    append_info: list[str | dict[str, Any]] | None = None
    enc_key: bytes | None = field(default=None, repr=False)
    enc_mode: str = "AES-GCM"
    exception_save: bool = False
    _: KW_ONLY
    incremental: bool = False
    crc_check: bool = False
    remove_redundancy: bool = False
    format: str = "ckpt"
    #: The extra information stored in each checkpoint (from ``append_info``), or None.
    append_dict: dict[str, Any] | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        owner = "CheckpointConfig"
        counts: dict[str, int | None] = {}
        for name in _COUNT_FIELDS:
            counts[name] = check_int(owner, name, getattr(self, name), minimum=0, allow_none=True)
        check_type(owner, "saved_network", self.saved_network, torch.nn.Module,
                   "a torch.nn.Module", allow_none=True)
        if not any(counts.values()):
            steps, seconds, keep_max, keep_minutes = counts.values()
            raise ValueError(
                f"For '{owner}', the arguments 'save_checkpoint_steps' ({steps}), "
                f"'save_checkpoint_seconds' ({seconds}), 'keep_checkpoint_max' ({keep_max}) and "
                f"'keep_checkpoint_per_n_minutes' ({keep_minutes}) can't all be None or 0."
            )
        for name in _FLAG_FIELDS:
            if name in _VALUE_ERROR_FLAGS and not isinstance(getattr(self, name), bool):
                # MindSpore 2.10 raises ValueError (not TypeError) for these flags
                raise value_error(owner, name, "a bool", getattr(self, name))
            check_bool(owner, name, getattr(self, name))
        self._set("append_dict", _append_dict(self.append_info))
        if self.enc_key is not None:  # MindSpore 2.10: ValueError also for a non-bytes key
            raise ValueError(
                f"For '{owner}', the argument 'enc_key' must be None, but got a "
                f"{type(self.enc_key).__name__}: lit_amp writes plain torch.save checkpoints and "
                "does not encrypt them; encrypt the files with your own tooling instead of "
                "relying on an unencrypted save."
            )
        for name, allowed in (("enc_mode", _ENC_MODES), ("format", _FORMATS)):
            value = getattr(self, name)
            if not isinstance(value, str):  # MindSpore 2.10: ValueError for the type too
                raise value_error(owner, name, "a str", value)
            check_choice(owner, name, value, allowed)
        self._normalise(counts)

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # the frozen dataclass's own initialisation

    def _normalise(self, counts: dict[str, int | None]) -> None:
        """MindSpore's precedence rules between the save triggers and the keep policies."""
        for name, value in counts.items():
            self._set(name, value)
        steps, keep_max = counts["save_checkpoint_steps"], counts["keep_checkpoint_max"]
        if steps and steps > 0:
            self._set("save_checkpoint_seconds", None)
        if keep_max and keep_max > 0:
            self._set("keep_checkpoint_per_n_minutes", None)
        elif not counts["keep_checkpoint_per_n_minutes"]:
            self._set("keep_checkpoint_max", 1)

    @property
    def map_param_inc(self) -> bool:
        """MindSpore's name for the ``incremental`` option (accepted, unused)."""
        return self.incremental

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
