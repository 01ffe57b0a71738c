"""Checkpoint files: MindSpore's ``save_checkpoint``, ``load_checkpoint``, ``load_param_into_net``.

Pure PyTorch. A checkpoint is a ``torch.save``d dict::

    {"network": <state_dict>, "optimizer": <state_dict or absent>,
     "loss_scale": <state or absent>, "append_info": {...}, "format": "lit_amp/1"}

Objects that know more than their ``state_dict`` (the train-step module holds the network,
the optimizer and the loss-scale state) implement ``checkpoint_state()`` and
``load_checkpoint_state(state)``; plain modules are saved as ``{"network": state_dict}``.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch

__all__ = ["save_checkpoint", "load_checkpoint", "load_param_into_net", "CHECKPOINT_FORMAT"]

CHECKPOINT_FORMAT = "lit_amp/1"


def _state_of(save_obj: Any) -> dict:
    if hasattr(save_obj, "checkpoint_state"):
        return dict(save_obj.checkpoint_state())
    if isinstance(save_obj, torch.nn.Module):
        return {"network": save_obj.state_dict()}
    if isinstance(save_obj, dict):
        return {"network": dict(save_obj)}
    raise TypeError(
        "save_checkpoint: 'save_obj' must be a torch.nn.Module, a dict of tensors or an object "
        f"with checkpoint_state(), but got {type(save_obj).__name__}."
    )


def save_checkpoint(save_obj: Any, ckpt_file_name: str, append_dict: dict | None = None) -> str:
    """Save ``save_obj`` to ``ckpt_file_name`` atomically (write to a temp file, then rename).

    Args:
        save_obj: a module, a dict name -> tensor, or an object with ``checkpoint_state()``.
        ckpt_file_name: the file to write; ``.ckpt`` is appended when missing.
        append_dict: extra values stored under ``"append_info"``.

    Returns:
        The path written.

    Example:
        >>> import tempfile, os
        >>> p = save_checkpoint(torch.nn.Linear(2, 2), os.path.join(tempfile.mkdtemp(), "a"))
        >>> sorted(load_checkpoint(p))[:1]
        ['append_info']
    """
    if not isinstance(ckpt_file_name, (str, os.PathLike)):
        raise TypeError(
            f"save_checkpoint: 'ckpt_file_name' must be a str path, but got "
            f"{type(ckpt_file_name).__name__}."
        )
    path = os.fspath(ckpt_file_name)
    if not path.endswith(".ckpt"):
        path += ".ckpt"
    state = _state_of(save_obj)
    state["append_info"] = dict(append_dict or {})
    state["format"] = CHECKPOINT_FORMAT
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".ckpt", dir=directory)
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def load_checkpoint(
    ckpt_file_name: str, net: Any = None, strict_load: bool = False, *, weights_only: bool = True
) -> dict:
    """Read a checkpoint written by :func:`save_checkpoint` (or by Lightning).

    Args:
        ckpt_file_name: the file.
        net: if given, the network (or an object with ``load_checkpoint_state``) is loaded.
        strict_load: passed to ``load_state_dict(strict=...)`` for a plain module.
        weights_only: unpickle tensors and plain containers only (safe for files from
            elsewhere); pass False only for a trusted file holding arbitrary objects.

    Returns:
        The checkpoint dict.

    Raises:
        ValueError: the file does not exist or is not a checkpoint.
    """
    path = os.fspath(ckpt_file_name)
    if not os.path.isfile(path):
        raise ValueError(f"load_checkpoint: 'ckpt_file_name' {path!r} does not exist.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=weights_only)
    except Exception as exc:  # pickle.UnpicklingError and friends
        raise ValueError(
            f"load_checkpoint: {path!r} could not be read with weights_only={weights_only} "
            f"({type(exc).__name__}: {exc}); if the file is trusted, pass weights_only=False."
        ) from exc
    if not isinstance(state, dict):
        raise ValueError(f"load_checkpoint: {path!r} does not hold a checkpoint dict.")
    if "network" not in state and "state_dict" in state:  # a Lightning checkpoint
        state = dict(state)
        state["network"] = state["state_dict"]
    if net is not None:
        load_param_into_net(net, state, strict_load=strict_load)
    return state


def load_param_into_net(net: Any, parameter_dict: dict, strict_load: bool = False) -> list[str]:
    """Load a checkpoint dict (or a plain state dict) into ``net``.

    Returns:
        The names of ``net``'s parameters that were not found in ``parameter_dict``.
    """
    if hasattr(net, "load_checkpoint_state") and "format" in parameter_dict:
        net.load_checkpoint_state(parameter_dict)
        return []
    if not isinstance(net, torch.nn.Module):
        raise TypeError(
            f"load_param_into_net: 'net' must be a torch.nn.Module, but got {type(net).__name__}."
        )
    sd = parameter_dict.get("network", parameter_dict)
    result = net.load_state_dict(sd, strict=strict_load)
    return list(result.missing_keys)
