"""MindSpore ``Model``'s argument rules (constructor, ``train``/``fit``, ``sink_size``).

Private to :mod:`lit_amp.model`; the messages come from :mod:`lit_amp._validation`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from lit_amp._validation import (
    check_bool,
    check_choice,
    check_int,
    check_str,
    check_type,
    type_error,
    value_error,
)
from lit_amp.amp.names import AMP_LEVELS, BOOST_LEVELS
from lit_amp.model.data_checks import check_dataset

__all__ = ["MODEL_KWARGS", "check_model_arguments", "check_sink_size", "check_train_args"]

log = logging.getLogger("lit_amp.model.lit_model")

MODEL_KWARGS = ("loss_scale_manager", "keep_batchnorm_fp32", "boost_config_dict", "acc_level")
_OWNER = "Model"  # LitModel takes MindSpore Model's constructor; errors name the public API


def check_model_arguments(
    network: Any,
    loss_fn: Any,
    optimizer: Any,
    eval_network: Any,
    eval_indexes: Any,
    amp_level: Any,
    boost_level: Any,
    kwargs: dict[str, Any],
) -> str:
    """MindSpore ``Model``'s constructor checks; returns the effective boost level.

    ``kwargs`` loses a deprecated ``acc_level`` (which overrides ``boost_level``).
    """
    unknown = sorted(set(kwargs) - set(MODEL_KWARGS))
    if unknown:
        raise ValueError(
            f"Unsupported keyword argument(s) {unknown}; the allowed keys are "
            f"{list(MODEL_KWARGS)}."
        )
    if "acc_level" in kwargs:
        log.warning("'acc_level' is deprecated; use 'boost_level'. It overrides boost_level.")
        boost_level = kwargs.pop("acc_level")
    check_type(_OWNER, "network", network, nn.Module, "a torch.nn.Module")
    if loss_fn is not None and not callable(loss_fn):
        raise type_error(_OWNER, "loss_fn", "a callable Module or None", loss_fn)
    check_type(_OWNER, "optimizer", optimizer, torch.optim.Optimizer, "a torch.optim.Optimizer",
               allow_none=True)
    check_type(_OWNER, "eval_network", eval_network, nn.Module, "a torch.nn.Module",
               allow_none=True)
    check_choice(_OWNER, "amp_level", check_str(_OWNER, "amp_level", amp_level), AMP_LEVELS)
    # MindSpore 2.10 raises ValueError for any boost_level outside its list, a non-str too
    check_choice(_OWNER, "boost_level", boost_level, BOOST_LEVELS)
    if eval_indexes is not None and (
        not isinstance(eval_indexes, list)
        or len(eval_indexes) != 3
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in eval_indexes)
    ):
        raise value_error(_OWNER, "eval_indexes", "None or a list of three ints [loss_index, "
                          "predict_index, label_index]", eval_indexes)
    if optimizer is None and amp_level != "O0":
        raise ValueError(
            f"Auto mixed precision will not work because 'optimizer' is None; amp_level "
            f"must be 'O0' without an optimizer, but got amp_level={amp_level!r}."
        )
    if optimizer is None and kwargs.get("loss_scale_manager") is not None:
        raise ValueError("'loss_scale_manager' needs an 'optimizer', but 'optimizer' is None.")
    if "keep_batchnorm_fp32" in kwargs:
        check_bool(_OWNER, "keep_batchnorm_fp32", kwargs["keep_batchnorm_fp32"])
    return boost_level


def check_sink_size(owner: str, sink_size: Any) -> int:
    """MindSpore's ``sink_size``: -1 (the dataset size) or a positive int."""
    check_int(owner, "sink_size", sink_size)
    if sink_size == 0 or sink_size < -1:
        raise value_error(owner, "sink_size", "-1 or a positive int", sink_size)
    return sink_size


def check_train_args(
    owner: str,
    epoch: Any,
    train_dataset: Any,
    dataset_sink_mode: Any,
    sink_size: Any,
    initial_epoch: Any,
) -> tuple[int | None, int]:
    """``Model.train``/``fit``'s checks; returns ``(dataset size, effective sink_size)``."""
    check_int(owner, "epoch", epoch, minimum=0)
    check_int(owner, "initial_epoch", initial_epoch, minimum=0)
    check_bool(owner, "dataset_sink_mode", dataset_sink_mode)
    check_sink_size(owner, sink_size)
    if initial_epoch >= epoch:
        raise ValueError(
            f"'initial_epoch' must be less than 'epoch' (the final epoch number), but got "
            f"initial_epoch={initial_epoch}, epoch={epoch}."
        )
    size = check_dataset(
        train_dataset, "train_dataset", sink=dataset_sink_mode, sink_size=sink_size
    )
    if dataset_sink_mode and sink_size == -1:
        assert size is not None
        sink_size = size
    return size, sink_size
