"""The AMP level table, hardware-aware ``auto`` resolution and :class:`AmpConfig`.

This is the *configuration* half of lit_amp's mixed precision: it decides and converts nothing
(the conversion is :mod:`lit_amp.amp.convert`, which imports this module and never the other
way round). :func:`resolve_amp_config` turns a level plus ``build_train_network``'s overrides
(``keep_batchnorm_fp32``, ``cast_model_type``, ``loss_scale_manager``) into a frozen
:class:`AmpConfig`, which :func:`lit_amp.amp.convert.apply_amp_config` applies. ``Model``,
``LitModel``, ``AmpPrecision`` and ``build_train_network`` all go through these two functions,
so they compute the same way. The table is docs/semantics.md §2.4; the default dtype by device
and ``auto`` are in docs/differences.md, "Mixed precision".

Example:
    >>> import torch
    >>> cfg = resolve_amp_config("O2", device="cpu")
    >>> cfg.level, cfg.dtype, cfg.keep_batchnorm_fp32, cfg.loss_scale_manager
    ('O2', torch.bfloat16, True, None)
    >>> cfg.mechanism
    'O2'
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from lit_amp._validation import check_bool, check_choice, check_str, type_error, value_error
from lit_amp.amp.names import AMP_LEVELS

__all__ = [
    "LOW_DTYPES",
    "AmpConfig",
    "UNSET",
    "check_amp_overrides",
    "check_loss_scale_manager",
    "resolve_amp_config",
    "validate_amp_level",
    "validate_amp_dtype",
    "default_amp_dtype",
    "cpu_has_native_bf16",
    "LEVEL_TABLE",
]

log = logging.getLogger(__name__)

#: The supported low-precision compute dtypes.
LOW_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------- validation
def validate_amp_level(level: Any, name: str = "amp_level", owner: str | None = None) -> None:
    """Check an AMP level: a ``str`` (TypeError) among ``O0, O1, O2, O3, auto`` (ValueError).

    Args:
        level: the value to check.
        name: the argument name used in the error message.
        owner: the public function or class named in the message (default: ``name``).

    Raises:
        TypeError: ``level`` is not a string.
        ValueError: ``level`` is not one of the allowed levels.

    Example:
        >>> validate_amp_level("O2")
        >>> validate_amp_level("O4", owner="Model")
        Traceback (most recent call last):
        ...
        ValueError: For 'Model', the argument 'amp_level' must be one of 'O0', 'O1', 'O2', 'O3', 'auto', but got 'O4'.
    """  # noqa: E501
    owner = owner or name
    check_str(owner, name, level)
    check_choice(owner, name, level, AMP_LEVELS)


def validate_amp_dtype(dtype: Any, name: str = "dtype", func: str = "auto_mixed_precision") -> None:
    """Check a low-precision dtype: ``torch.float16`` or ``torch.bfloat16`` (ValueError).

    Args:
        dtype: the value to check.
        name: the argument name used in the error message.
        func: the public function or class named in the message.

    Raises:
        ValueError: ``dtype`` is not float16 or bfloat16.

    Example:
        >>> validate_amp_dtype(torch.bfloat16)
        >>> validate_amp_dtype(torch.float32)
        Traceback (most recent call last):
        ...
        ValueError: For 'auto_mixed_precision', the argument 'dtype' must be torch.float16 or torch.bfloat16, but got torch.float32.
    """  # noqa: E501
    if dtype not in LOW_DTYPES:
        raise value_error(func, name, "torch.float16 or torch.bfloat16", dtype)



class _Unset:
    """Sentinel: an argument that was not passed (``None`` is a meaningful value)."""

    _instance: _Unset | None = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __reduce__(self) -> str:
        return "UNSET"


#: Sentinel for "``loss_scale_manager`` not given" (``None`` explicitly disables scaling).
UNSET: Any = _Unset()

#: MindSpore's ``_config_level``; ``"low"`` stands for the compute dtype, ``"dynamic"`` for
#: ``DynamicLossScaleManager()`` when that dtype is float16.
LEVEL_TABLE: dict[str, dict[str, Any]] = {
    "O0": {"keep_batchnorm_fp32": False, "cast_model_type": torch.float32, "loss_scale": None},
    "O1": {"keep_batchnorm_fp32": False, "cast_model_type": torch.float32, "loss_scale": None},
    "O2": {"keep_batchnorm_fp32": True, "cast_model_type": "low", "loss_scale": "dynamic"},
    "O3": {"keep_batchnorm_fp32": False, "cast_model_type": "low", "loss_scale": None},
}


@dataclass(frozen=True)
class AmpConfig:
    """A resolved mixed-precision configuration.

    Attributes:
        level: ``"O0"``-``"O3"`` (``"auto"`` already resolved).
        dtype: the low compute dtype (float16 or bfloat16).
        keep_batchnorm_fp32: black-listed normalisations stay in float32 when the model is cast.
        cast_model_type: float32 (not cast as a whole) or the low dtype.
        loss_scale_manager: ``None`` or a loss-scale manager.
        loss_in_fp32: network outputs and floating labels are cast to float32 before the loss.
        output_fp32: the converted network casts its output to float32.
        requested_level: the level as given (``"auto"`` stays visible here).
        device_type: the device type the configuration was resolved for.
        white_list: a custom white list (O1 mechanism), or ``None`` for the built-in one.
        black_list: a custom black list (O2 mechanism), or ``None`` for the built-in one.
        cache_casts: keep low-precision parameter copies between optimizer steps.

    Example:
        >>> resolve_amp_config("O3", device="cpu").mechanism
        'O3'
    """

    level: str
    dtype: torch.dtype
    keep_batchnorm_fp32: bool
    cast_model_type: torch.dtype
    loss_scale_manager: Any
    loss_in_fp32: bool
    output_fp32: bool
    requested_level: str = ""
    device_type: str = "cpu"
    white_list: tuple | None = None
    black_list: tuple | None = None
    cache_casts: bool = True

    @property
    def mechanism(self) -> str:
        """The conversion actually applied: ``"none"``, ``"O1"``, ``"O2"`` or ``"O3"``.

        This is MindSpore's precision pass of ``build_train_network``: a low
        ``cast_model_type`` casts the model (O2 with ``keep_batchnorm_fp32``, else O3); O2 with
        ``keep_batchnorm_fp32=False`` casts BatchNorm too (O3); ``cast_model_type=float32``
        overrides O2/O3 to no conversion; otherwise the level's own pass (O0 none, O1 white
        list).
        """
        return _mechanism(self.level, self.keep_batchnorm_fp32, self.cast_model_type)


def _mechanism(level: str, keep_bn: bool, cast: torch.dtype) -> str:
    if cast in LOW_DTYPES:
        return "O2" if keep_bn else "O3"
    if not keep_bn and level == "O2":
        return "O3"
    if cast == torch.float32 and level in ("O2", "O3"):
        return "none"
    return "O1" if level == "O1" else "none"


# ----------------------------------------------------------------------------- hardware
@functools.lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return frozenset(flags)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16, AMX-BF16 or ARM BF16).

    Reads ``/proc/cpuinfo`` (x86 ``flags`` / aarch64 ``Features``); elsewhere falls back to
    PyTorch's oneDNN capability check.

    Example:
        >>> isinstance(cpu_has_native_bf16(), bool)
        True
    """
    flags = _cpu_flags()
    if flags:
        return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # pragma: no cover - platform dependent
        return False


def _device_type(device: torch.device | str | None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device).type


def default_amp_dtype(device: torch.device | str | None) -> torch.dtype:
    """float16 on CUDA (MindSpore's default), bfloat16 elsewhere.

    Example:
        >>> default_amp_dtype("cpu")
        torch.bfloat16
    """
    return torch.float16 if _device_type(device) == "cuda" else torch.bfloat16


def _cuda_bf16_supported() -> bool:
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    except Exception:  # pragma: no cover
        return False


def _resolve_auto(device_type: str, dtype: torch.dtype | None) -> tuple[str, torch.dtype]:
    if device_type == "cuda":
        if dtype is not None:
            return "O2", dtype
        return "O2", torch.bfloat16 if _cuda_bf16_supported() else torch.float16
    if device_type == "cpu" and cpu_has_native_bf16():
        return "O2", dtype if dtype is not None else torch.bfloat16
    warnings.warn(
        f"amp_level='auto' found no native 16-bit compute on device type {device_type!r} "
        "(CPU without avx512_bf16/amx_bf16); falling back to 'O0' (float32).",
        UserWarning,
        stacklevel=3,
    )
    return "O0", dtype if dtype is not None else torch.bfloat16


# ----------------------------------------------------------------------------- resolve
def _default_manager(level: str, dtype: torch.dtype) -> Any:
    if LEVEL_TABLE[level]["loss_scale"] == "dynamic" and dtype == torch.float16:
        from lit_amp.amp.loss_scale.managers import DynamicLossScaleManager

        return DynamicLossScaleManager()
    return None


def check_loss_scale_manager(manager: Any, owner: str = "resolve_amp_config") -> None:
    """Check a ``loss_scale_manager`` argument: None or a loss-scale manager (TypeError).

    A manager is a :class:`~lit_amp.amp.loss_scale.managers.LossScaleManager` or any object
    with its two methods ``get_loss_scale`` and ``get_update_cell``.

    Args:
        manager: the value to check.
        owner: the public function or class named in the message.

    Raises:
        TypeError: ``manager`` is neither None nor a loss-scale manager.

    Example:
        >>> check_loss_scale_manager(None)
        >>> check_loss_scale_manager(2.0, "Model")
        Traceback (most recent call last):
        ...
        TypeError: For 'Model', the argument 'loss_scale_manager' must be None or a LossScaleManager (FixedLossScaleManager, DynamicLossScaleManager), but got 2.0 of type float.
    """  # noqa: E501
    if manager is None:
        return
    from lit_amp.amp.loss_scale.managers import LossScaleManager

    ok = isinstance(manager, LossScaleManager) or (
        hasattr(manager, "get_loss_scale") and hasattr(manager, "get_update_cell")
    )
    if not ok:
        raise type_error(owner, "loss_scale_manager", "None or a LossScaleManager "
                         "(FixedLossScaleManager, DynamicLossScaleManager)", manager)


def check_amp_overrides(
    owner: str,
    *,
    dtype: Any = None,
    keep_batchnorm_fp32: Any = None,
    cast_model_type: Any = None,
    loss_scale_manager: Any = UNSET,
) -> None:
    """Check the optional overrides of a level (each may be None / not given).

    Args:
        owner: the public function or class named in the messages.
        dtype: ``torch.float16`` or ``torch.bfloat16``.
        keep_batchnorm_fp32: a bool.
        cast_model_type: ``torch.float32``, ``torch.float16`` or ``torch.bfloat16``; a low one
            must equal ``dtype`` when both are given.
        loss_scale_manager: see :func:`check_loss_scale_manager` (``UNSET``: not given).

    Raises:
        TypeError: ``keep_batchnorm_fp32`` not a bool; a manager of the wrong type.
        ValueError: ``dtype``/``cast_model_type`` not allowed or conflicting.

    Example:
        >>> check_amp_overrides("AmpPrecision", dtype=torch.bfloat16, keep_batchnorm_fp32=True)
        >>> check_amp_overrides("AmpPrecision", cast_model_type=torch.int8)
        Traceback (most recent call last):
        ...
        ValueError: For 'AmpPrecision', the argument 'cast_model_type' must be torch.float16, torch.bfloat16 or torch.float32, but got torch.int8.
    """  # noqa: E501
    if dtype is not None:
        validate_amp_dtype(dtype, "dtype", owner)
    if cast_model_type is not None and cast_model_type not in (torch.float32, *LOW_DTYPES):
        raise value_error(owner, "cast_model_type",
                          "torch.float16, torch.bfloat16 or torch.float32", cast_model_type)
    if cast_model_type in LOW_DTYPES and dtype is not None and dtype != cast_model_type:
        raise ValueError(
            f"For '{owner}', the arguments 'dtype' ({dtype!r}) and 'cast_model_type' "
            f"({cast_model_type!r}) conflict: a low cast_model_type is the compute dtype."
        )
    if keep_batchnorm_fp32 is not None:
        check_bool(owner, "keep_batchnorm_fp32", keep_batchnorm_fp32)
    if loss_scale_manager is not UNSET:
        check_loss_scale_manager(loss_scale_manager, owner)


def resolve_amp_config(
    level: str,
    *,
    device: torch.device | str | None,
    dtype: torch.dtype | None = None,
    keep_batchnorm_fp32: bool | None = None,
    cast_model_type: torch.dtype | None = None,
    loss_scale_manager: Any = UNSET,
    white_list: Iterable | None = None,
    black_list: Iterable | None = None,
    cache_casts: bool = True,
) -> AmpConfig:
    """Resolve a level and its overrides into an :class:`AmpConfig`.

    Args:
        level: ``"O0"``, ``"O1"``, ``"O2"``, ``"O3"`` or ``"auto"``.
        device: where the network will run (``None``: CUDA if available, else CPU); it picks
            the default dtype and the ``auto`` level.
        dtype: the low compute dtype; ``None`` -> float16 on CUDA, bfloat16 elsewhere (or the
            low ``cast_model_type`` when one is given).
        keep_batchnorm_fp32: overrides the level's value.
        cast_model_type: ``torch.float32``, ``torch.float16`` or ``torch.bfloat16``; overrides
            the level's value.
        loss_scale_manager: overrides the level's default (``None`` disables loss scaling).
        white_list: custom white list for the O1 mechanism (see ``custom_mixed_precision``).
        black_list: custom black list for the O2 mechanism.
        cache_casts: keep low-precision parameter copies between optimizer steps.

    Returns:
        The frozen configuration.

    Raises:
        TypeError: ``level`` not a str; ``keep_batchnorm_fp32`` not a bool;
            ``loss_scale_manager`` of the wrong type.
        ValueError: unknown level; ``dtype``/``cast_model_type`` not allowed or conflicting.

    Example:
        >>> cfg = resolve_amp_config("O2", device="cuda", dtype=torch.float16)
        >>> type(cfg.loss_scale_manager).__name__
        'DynamicLossScaleManager'
    """
    validate_amp_level(level, "level", "resolve_amp_config")
    device_type = _device_type(device)
    check_amp_overrides("resolve_amp_config", dtype=dtype, keep_batchnorm_fp32=keep_batchnorm_fp32,
                        cast_model_type=cast_model_type, loss_scale_manager=loss_scale_manager)
    if cast_model_type in LOW_DTYPES:
        dtype = cast_model_type

    requested = level
    if level == "auto":
        level, dtype = _resolve_auto(device_type, dtype)
    elif dtype is None:
        dtype = default_amp_dtype(device_type)
    assert dtype is not None

    table = LEVEL_TABLE[level]
    keep_bn = table["keep_batchnorm_fp32"] if keep_batchnorm_fp32 is None else keep_batchnorm_fp32
    cast = cast_model_type
    if cast is None:
        cast = dtype if table["cast_model_type"] == "low" else torch.float32
    manager = (
        _default_manager(level, dtype) if loss_scale_manager is UNSET else loss_scale_manager
    )
    mech = _mechanism(level, keep_bn, cast)
    if white_list is not None and mech != "O1":
        warnings.warn(
            f"white_list is used only by the O1 mechanism; ignored at level {level!r}.",
            UserWarning,
            stacklevel=2,
        )
    if black_list is not None and mech != "O2":
        warnings.warn(
            f"black_list is used only by the O2 mechanism; ignored at level {level!r}.",
            UserWarning,
            stacklevel=2,
        )
    if mech != "none" and dtype == torch.float16 and device_type == "cpu":
        warnings.warn(
            "float16 compute was requested on CPU, where float16 matrix multiplication is "
            "orders of magnitude slower than bfloat16; use dtype=torch.bfloat16 on CPU.",
            UserWarning,
            stacklevel=2,
        )
    cfg = AmpConfig(
        level=level,
        dtype=dtype,
        keep_batchnorm_fp32=keep_bn,
        cast_model_type=cast,
        loss_scale_manager=manager,
        loss_in_fp32=mech != "none",
        output_fp32=mech in ("O2", "O3"),
        requested_level=requested,
        device_type=device_type,
        white_list=None if white_list is None else tuple(white_list),
        black_list=None if black_list is None else tuple(black_list),
        cache_casts=cache_casts,
    )
    return cfg
