"""MindSpore's checkpoint functions: save_checkpoint, load_checkpoint, load_param_into_net.

One checkpoint format: every lit_amp checkpoint is a Lightning checkpoint, a torch-saved dict as
``Trainer.save_checkpoint`` writes it, plus lit_amp's keys::

    {"state_dict": <the LightningModule's names: network.* for a LitModel>,
     "optimizer_states": [...], "lr_schedulers": [...], "epoch", "global_step", "loops",
     "callbacks", "pytorch-lightning_version", "hyper_parameters" (when saved),
     # lit_amp's additions:
     "lit_amp_loss_scale": <loss-scale state>, "lit_amp_boost": <AutoBoost state>,
     "append_info": {...}, "lit_amp_network_prefix": "network.", "lit_amp_format": "lit_amp/2"}

An object that knows more than its ``state_dict`` implements ``checkpoint_state()`` (returning
that dict; a ``LitModel`` builds it with its Trainer while one runs) and
``load_checkpoint_state(views)``; a plain module is saved as ``{"state_dict": <its own names>,
"lit_amp_network_prefix": ""}`` plus the two lit_amp keys. :func:`load_checkpoint` reads these
files and Lightning's own and adds four derived views (:func:`checkpoint_views`): ``"network"``
(the weights under the network's own names), ``"optimizer"``, ``"loss_scale"`` and
``"append_info"``; as in MindSpore, each ``append_info`` entry (``"epoch_num"``, ``"step_num"``,
a user's values) is also a key of its own. Files are written with
:func:`lit_amp._io.atomic_write`.

A *row increment* (``online_train``'s ``full_every_n_checkpoints > 1``) holds only the rows
changed since the previous checkpoint of some big tensors; :func:`load_checkpoint` reads its
chain back to the full checkpoint (the format and its reader:
:mod:`lit_amp.rec.state.increments`).

Example:
    >>> from lit_amp.serialization import save_checkpoint, load_checkpoint
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from lit_amp._io import atomic_write
from lit_amp.rec.state.increments import CHAIN_KEY, ROWS_KEY, resolve_rows

__all__ = [
    "BOOST_KEY",
    "CHECKPOINT_FORMAT",
    "FORMAT_KEY",
    "LOSS_SCALE_KEY",
    "PREFIX_KEY",
    "RESERVED_KEYS",
    "checkpoint_payload",
    "checkpoint_views",
    "load_checkpoint",
    "load_param_into_net",
    "network_state",
    "save_checkpoint",
    "write_checkpoint",
]

log = logging.getLogger(__name__)

#: the version of lit_amp's checkpoint files (Lightning's dict plus lit_amp's keys)
CHECKPOINT_FORMAT = "lit_amp/2"
#: the key of :data:`CHECKPOINT_FORMAT` in a file
FORMAT_KEY = "lit_amp_format"
#: where the network's names start in ``state_dict`` (``"network."`` for a LitModel)
PREFIX_KEY = "lit_amp_network_prefix"
#: the loss-scale state (``LossScaleController.STATE_KEY``)
LOSS_SCALE_KEY = "lit_amp_loss_scale"
#: the ``AutoBoost`` state
BOOST_KEY = "lit_amp_boost"
#: the keys of a checkpoint dict an ``append_info`` entry may not take (each entry is also a
#: top-level key of what :func:`load_checkpoint` returns): Lightning's, lit_amp's, the views
RESERVED_KEYS = frozenset({
    "state_dict", "optimizer_states", "lr_schedulers", "epoch", "global_step", "loops",
    "callbacks", "pytorch-lightning_version", "hyper_parameters", "hparams_name",
    "datamodule_hyper_parameters", "datamodule_hparams_name", "network", "optimizer",
    "loss_scale", "append_info", FORMAT_KEY, PREFIX_KEY, ROWS_KEY, CHAIN_KEY, LOSS_SCALE_KEY,
    BOOST_KEY,
})


def _state_of(save_obj: Any) -> dict:
    if hasattr(save_obj, "checkpoint_state"):
        state = save_obj.checkpoint_state()
        if not (isinstance(state, dict) and isinstance(state.get("state_dict"), dict)):
            keys = sorted(map(str, state)) if isinstance(state, dict) else "-"
            raise TypeError(
                f"save_checkpoint: {type(save_obj).__name__}.checkpoint_state() must return "
                "Lightning's checkpoint dict, with the weights under 'state_dict' (and "
                "'lit_amp_network_prefix', 'optimizer_states' where they apply), but got "
                f"{type(state).__name__} with keys {keys}."
            )
        return dict(state)
    if isinstance(save_obj, torch.nn.Module):
        return {"state_dict": save_obj.state_dict(), PREFIX_KEY: ""}
    if isinstance(save_obj, dict):
        return {"state_dict": dict(save_obj), PREFIX_KEY: ""}
    raise TypeError(
        "save_checkpoint: 'save_obj' must be a torch.nn.Module, a dict of tensors or an object "
        f"with checkpoint_state(), but got {type(save_obj).__name__}."
    )


def save_checkpoint(save_obj: Any, ckpt_file_name: str, append_dict: dict | None = None) -> str:
    """Save ``save_obj`` to ``ckpt_file_name`` atomically (write to a temp file, then rename).

    Args:
        save_obj: a module, a dict name -> tensor, or an object with ``checkpoint_state()``.
        ckpt_file_name: the file to write; ``.ckpt`` is appended when missing.
        append_dict: extra values stored under ``"append_info"`` (each one also a top-level key of
            what :func:`load_checkpoint` returns, so its name may not be one of
            :data:`RESERVED_KEYS`).

    Returns:
        The path written.

    Raises:
        TypeError: ``save_obj`` or ``ckpt_file_name`` has the wrong type.
        ValueError: an ``append_dict`` key names an entry of the checkpoint dict.

    Example:
        >>> import tempfile, os
        >>> p = save_checkpoint(torch.nn.Linear(2, 2), os.path.join(tempfile.mkdtemp(), "a"))
        >>> sorted(load_checkpoint(p)["network"])
        ['bias', 'weight']
    """
    if not isinstance(ckpt_file_name, (str, os.PathLike)):
        raise TypeError(
            f"save_checkpoint: 'ckpt_file_name' must be a str path, but got "
            f"{type(ckpt_file_name).__name__}."
        )
    return write_checkpoint(checkpoint_payload(save_obj, append_dict), ckpt_file_name)


def checkpoint_payload(save_obj: Any, append_dict: dict | None = None) -> dict:
    """The dict :func:`save_checkpoint` writes for ``save_obj``: Lightning's checkpoint dict.

    For a ``LitModel`` (or ``Model.train_network``) inside a running Trainer this is what the
    Trainer's ``dump_checkpoint`` builds (optimizer, loops, callbacks, loss scale, ...); for a
    plain module ``{"state_dict": ...}``. lit_amp adds ``"append_info"`` and
    ``"lit_amp_format"`` (see the module docstring).

    Under DDP/FSDP call it on **every** rank (building the state may be a collective, e.g. the
    full state dict of a sharded network) and write it with :func:`write_checkpoint` on rank 0.

    Args:
        save_obj: a module, a dict name -> tensor, or an object with ``checkpoint_state()``.
        append_dict: extra values stored under ``"append_info"``.

    Returns:
        The checkpoint dict.

    Raises:
        TypeError: ``save_obj`` is none of the above.
        ValueError: an ``append_dict`` key is one of :data:`RESERVED_KEYS` or a key of the state
            (:func:`load_checkpoint` returns each entry as a key of its own too).

    Example:
        >>> sorted(checkpoint_payload(torch.nn.Linear(2, 2)))
        ['append_info', 'lit_amp_format', 'lit_amp_network_prefix', 'state_dict']
    """
    state = _state_of(save_obj)
    append = dict(append_dict or {})
    taken = sorted(str(k) for k in append if k in RESERVED_KEYS or k in state)
    if taken:
        raise ValueError(
            f"save_checkpoint: the append_dict key {taken[0]!r} names an entry of the checkpoint "
            "dict (load_checkpoint returns each append_dict entry as a key of its own, as "
            "MindSpore does); use another name."
        )
    state["append_info"] = append
    state[FORMAT_KEY] = CHECKPOINT_FORMAT
    return state


def write_checkpoint(payload: dict, ckpt_file_name: str | os.PathLike) -> str:
    """Write a :func:`checkpoint_payload` to ``ckpt_file_name`` atomically; returns the path.

    ``.ckpt`` is appended when missing.
    """
    if not isinstance(ckpt_file_name, (str, os.PathLike)):
        raise TypeError(
            f"write_checkpoint: 'ckpt_file_name' must be a str path, but got "
            f"{type(ckpt_file_name).__name__}."
        )
    path = os.fspath(ckpt_file_name)
    if not path.endswith(".ckpt"):
        path += ".ckpt"
    return atomic_write(path, lambda f: torch.save(payload, f), drop_cache=True)


def load_checkpoint(
    ckpt_file_name: str,
    net: Any = None,
    strict_load: bool = False,
    *,
    choice_func: Callable[[str], bool] | None = None,
    weights_only: bool = True,
) -> dict:
    """Read a checkpoint written by :func:`save_checkpoint` (or by Lightning).

    As MindSpore's, the dict returned holds each ``append_info`` entry as a key of its own
    (``param_dict["epoch_num"]``), and ``choice_func`` picks the parameters (and appended
    entries) to return.

    Args:
        ckpt_file_name: the file: lit_amp's or Lightning's (``Trainer.save_checkpoint``,
            Lightning's ``ModelCheckpoint``).
        net: if given, it is loaded: an object with ``load_checkpoint_state`` (a ``LitModel``,
            ``Model.train_network``) gets the whole state (weights, optimizer, loss scale,
            boost; strictly), a plain module its weights (:func:`load_param_into_net`).
        strict_load: for a plain module, every parameter must be found and nothing else
            (MindSpore's default False loads the matching ones and warns about the others).
        choice_func: ``name -> bool``, MindSpore's: a parameter (under the network's own name,
            e.g. ``"0.weight"``) or ``append_info`` entry is returned where it returns True,
            removed where False. The optimizer state is kept whole.
        weights_only: unpickle tensors and plain containers only (safe for files from
            elsewhere); pass False only for a trusted file holding arbitrary objects.

    Returns:
        The checkpoint dict with the derived views ``"network"``, ``"optimizer"``,
        ``"loss_scale"`` and ``"append_info"``, and each ``append_info`` entry as a key
        (:func:`checkpoint_views`).

    Raises:
        TypeError: ``ckpt_file_name`` is not a str path; ``choice_func`` is not callable.
        ValueError: the file does not exist or is not a checkpoint; ``choice_func`` leaves no
            parameter and no entry (MindSpore's error too); ``net`` is given and
            the file holds none of its parameters (under any prefix; see
            :func:`load_param_into_net`).
        RuntimeError: ``net`` does not fit the file (missing or unexpected keys, other
            shapes) where the load is strict; the message names the file.
    """
    if not isinstance(ckpt_file_name, (str, os.PathLike)):
        raise TypeError(
            f"load_checkpoint: 'ckpt_file_name' must be a str path, but got "
            f"{ckpt_file_name!r} of type {type(ckpt_file_name).__name__}."
        )
    if choice_func is not None and not callable(choice_func):
        raise TypeError(
            f"load_checkpoint: 'choice_func' must be a callable name -> bool or None, but got "
            f"{choice_func!r} of type {type(choice_func).__name__}."
        )
    path = os.fspath(ckpt_file_name)
    state = _read(path, weights_only)
    if ROWS_KEY in state:
        del state  # read again below, memory-mapped: its rows a part at a time
        state = resolve_rows(path, lambda at, mmap: _read(at, weights_only, mmap=mmap))
    if choice_func is not None:
        state = _chosen(state, choice_func, path)
    state = checkpoint_views(state)
    if net is not None:
        _load_into(net, state, strict_load, repr(path))
    return state


def _is_checkpoint(state: dict) -> bool:
    return isinstance(state.get("state_dict"), dict)


def _prefix_of(state: dict) -> str:
    """Where the network's names start in ``state["state_dict"]``."""
    prefix = state.get(PREFIX_KEY)
    if isinstance(prefix, str):
        return prefix
    return "network." if any(str(k).startswith("network.") for k in state["state_dict"]) else ""


def _chosen(state: dict, choice_func: Callable[[str], Any], path: str) -> dict:
    """``state`` with the weights and ``append_info`` entries ``choice_func`` rejects removed.

    A weight is named as the network names it (the checkpoint's prefix removed); a key outside
    that prefix which holds the same tensor as a rejected one (a ``LitModel``'s train cell
    reaching the network by another path) goes with it; other keys are named in full.

    Raises:
        ValueError: nothing is left (MindSpore refuses an empty parameter dict too).
    """
    out = dict(state)
    if not _is_checkpoint(state):  # a bare state dict: its keys are the names
        out = {k: v for k, v in state.items() if not isinstance(k, str) or choice_func(k)}
        kept = bool(out)
    else:
        sd, prefix = state["state_dict"], _prefix_of(state)
        dropped: set[tuple[int, tuple]] = set()
        keep: dict[Any, bool] = {}
        for k, v in sd.items():
            if isinstance(k, str) and k.startswith(prefix):
                keep[k] = bool(choice_func(k[len(prefix):]))
                if not keep[k] and torch.is_tensor(v) and v.numel():
                    dropped.add((v.data_ptr(), tuple(v.shape)))
        for k, v in sd.items():
            if k not in keep:
                twin = torch.is_tensor(v) and (v.data_ptr(), tuple(v.shape)) in dropped
                keep[k] = not twin and (not isinstance(k, str) or bool(choice_func(k)))
        filtered = copy.copy(sd)  # its type and metadata kept
        for k in [k for k in sd if not keep[k]]:
            del filtered[k]
        out["state_dict"] = filtered
        info = state.get("append_info")
        if isinstance(info, dict):
            out["append_info"] = {k: v for k, v in info.items() if choice_func(str(k))}
        kept = bool(filtered) or bool(out.get("append_info"))
    if not kept:
        raise ValueError(
            f"load_checkpoint: 'choice_func' kept no parameter of {path!r} (MindSpore refuses "
            "an empty parameter dict too); it is called with the network's own names, e.g. "
            f"{sorted(map(str, _names(state)))[:3]}."
        )
    return out


def _names(state: dict) -> list:
    if not _is_checkpoint(state):
        return list(state)
    prefix = _prefix_of(state)
    return [k[len(prefix):] for k in state["state_dict"]
            if isinstance(k, str) and k.startswith(prefix)]


def _read(path: str, weights_only: bool, *, mmap: bool = False) -> dict:
    if not os.path.isfile(path):
        raise ValueError(f"load_checkpoint: 'ckpt_file_name' {path!r} does not exist.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=weights_only, mmap=mmap)
    except Exception as exc:  # pickle.UnpicklingError and friends
        raise ValueError(
            f"load_checkpoint: {path!r} could not be read with weights_only={weights_only} "
            f"({type(exc).__name__}: {exc}); if the file is trusted, pass weights_only=False."
        ) from exc
    if not isinstance(state, dict):
        raise ValueError(f"load_checkpoint: {path!r} does not hold a checkpoint dict.")
    return state


def checkpoint_views(state: dict) -> dict:
    """``state`` (a checkpoint dict of any kind) with the derived views lit_amp's readers use.

    ``"network"``: the network's weights under its own names (a Lightning ``state_dict``
    with the prefix ``lit_amp_network_prefix`` removed; without that key, ``network.`` --
    a ``LitModel``'s -- when present, else the whole ``state_dict``); ``"optimizer"``: the
    first of ``optimizer_states`` (None if none); ``"loss_scale"``: the loss-scale state (None
    if none); ``"append_info"``: MindSpore's extra values (``{}`` if none), each
    also a key of its own as MindSpore's ``load_checkpoint`` returns them (``"epoch_num"``; the
    checkpoint's own keys and the views win a clash, which :func:`checkpoint_payload` refuses
    to write). The views share the tensors (no copy). A bare state dict (no ``"state_dict"``)
    is returned as it is.

    Args:
        state: what ``torch.load`` returned for a checkpoint file.

    Returns:
        A new dict: ``state``'s entries plus the views.

    Example:
        >>> sd = {"network.weight": torch.ones(1), "_train_network.x.weight": torch.ones(1)}
        >>> v = checkpoint_views({"state_dict": sd, "optimizer_states": [{"state": {}}]})
        >>> sorted(v["network"]), v["optimizer"], v["loss_scale"], v["append_info"]
        (['weight'], {'state': {}}, None, {})
    """
    out = dict(state)
    if not _is_checkpoint(state):
        return out  # a bare state dict: its entries are the weights
    sd = state["state_dict"]
    prefix = _prefix_of(state)
    out["network"] = {k[len(prefix):]: v for k, v in sd.items()
                      if isinstance(k, str) and k.startswith(prefix)}
    opts = state.get("optimizer_states") or []
    out["optimizer"] = opts[0] if opts else None
    out["loss_scale"] = state.get(LOSS_SCALE_KEY)
    if not isinstance(out.get("append_info"), dict):
        out["append_info"] = {}
    for key, value in out["append_info"].items():
        if isinstance(key, str) and key not in RESERVED_KEYS:
            out.setdefault(key, value)
    return out


def network_state(weights: dict, network: torch.nn.Module, source: str = "the checkpoint") -> dict:
    """The entries of ``weights`` that belong to ``network``, under the network's own names.

    A Lightning checkpoint names a ``LitModel``'s parameters by their attribute path
    (``network.0.weight``); the prefix (``""``, ``network.``, ``lit_model.network.``, ...) is
    the one under which the most of ``network``'s names are found. Prefixes tied with it must
    hold the same tensors (the same module reached by another path, as ``LitModel``'s train
    and eval cells); the shortest is then taken.

    Args:
        weights: a state dict (lit_amp's ``network`` or Lightning's ``state_dict``).
        network: the module to load.
        source: the file (or object) the weights come from, for messages.

    Returns:
        ``{name: tensor}`` with the prefix removed (only the entries under it).

    Raises:
        ValueError: no entry matches a name of ``network`` under any prefix, or two prefixes
            match equally well with different tensors.

    Example:
        >>> net = torch.nn.Linear(2, 1)
        >>> sd = {"network.weight": torch.ones(1, 2), "network.bias": torch.ones(1)}
        >>> sorted(network_state(sd, net))
        ['bias', 'weight']
    """
    own = set(network.state_dict())
    votes: dict[str, int] = {}
    for key in weights:
        if not isinstance(key, str):
            continue
        cut = 0
        while True:
            if key[cut:] in own:
                votes[key[:cut]] = votes.get(key[:cut], 0) + 1
            cut = key.find(".", cut) + 1
            if cut == 0:
                break
    if not votes:
        raise ValueError(
            f"load_checkpoint: {source} holds no parameter of the network "
            f"{type(network).__name__} (it lacks e.g. {sorted(own)[:3]}; it has e.g. "
            f"{sorted(map(str, weights))[:3]}). Load a checkpoint written for this network."
        )
    best = max(votes.values())
    tied = sorted((p for p, n in votes.items() if n == best), key=lambda p: (len(p), p))
    prefix = tied[0]
    chosen = {k[len(prefix):]: v for k, v in weights.items()
              if isinstance(k, str) and k.startswith(prefix) and k[len(prefix):] in own}
    for other in tied[1:]:
        for name, value in chosen.items():
            twin = weights.get(other + name)
            if twin is not None and not (torch.is_tensor(value) and torch.is_tensor(twin)
                                         and value.shape == twin.shape
                                         and torch.equal(value, twin)):
                raise ValueError(
                    f"load_checkpoint: {source} holds the parameters of "
                    f"{type(network).__name__} under several prefixes with different values "
                    f"({prefix!r} and {other!r}); pass the state dict of the one you mean "
                    f"with the prefix removed to load_param_into_net."
                )
    return {k[len(prefix):]: v for k, v in weights.items()
            if isinstance(k, str) and k.startswith(prefix)}


def _weights_of(parameter_dict: dict) -> dict:
    for key in ("network", "state_dict"):  # load_checkpoint's view, or Lightning's entry
        if isinstance(parameter_dict.get(key), dict):
            return parameter_dict[key]
    return parameter_dict


def _load_optimizer(opt: torch.optim.Optimizer, parameter_dict: Any, source: str) -> None:
    """Restore ``opt`` from a checkpoint dict's optimizer state (MindSpore's
    ``load_param_into_net(optimizer, param_dict)``)."""
    if not isinstance(parameter_dict, dict):
        raise TypeError(
            f"load_param_into_net: 'parameter_dict' must be a dict, but got "
            f"{type(parameter_dict).__name__}."
        )
    if "state" in parameter_dict and "param_groups" in parameter_dict:
        state = parameter_dict  # an optimizer's own state_dict()
    elif _is_checkpoint(parameter_dict):
        state = checkpoint_views(parameter_dict)["optimizer"]
    else:
        state = parameter_dict.get("optimizer")
    if not isinstance(state, dict):
        raise ValueError(
            f"load_param_into_net: {source} holds no optimizer state to load into "
            f"{type(opt).__name__} (a checkpoint of a network alone, or of a Model without an "
            "optimizer); load it from a checkpoint ModelCheckpoint or Model wrote during training."
        )
    try:
        opt.load_state_dict(state)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise ValueError(f"load_param_into_net: the optimizer state of {source} does not fit "
                         f"{type(opt).__name__}: {exc}") from exc


def _load_into(net: Any, parameter_dict: dict, strict_load: bool,
               source: str) -> tuple[list[str], list[str]]:
    if isinstance(net, torch.optim.Optimizer):
        _load_optimizer(net, parameter_dict, source)
        return [], []
    if hasattr(net, "load_checkpoint_state") and isinstance(parameter_dict, dict) \
            and _is_checkpoint(parameter_dict):
        views = checkpoint_views(parameter_dict)
        inner = getattr(net, "network", None)
        lightning = isinstance(parameter_dict.get("state_dict"), dict)
        if lightning and isinstance(inner, torch.nn.Module):
            # a train cell (TrainOneStepCell): its own network's names, found by matching
            views["network"] = network_state(parameter_dict["state_dict"], inner, source)
        try:
            net.load_checkpoint_state(views)
        except (RuntimeError, KeyError) as exc:
            raise RuntimeError(
                f"load_checkpoint: {source} does not fit {type(net).__name__}: {exc}"
            ) from exc
        return [], []
    if not isinstance(net, torch.nn.Module):
        raise TypeError(
            f"load_param_into_net: 'net' must be a torch.nn.Module or a torch optimizer, but "
            f"got {type(net).__name__}."
        )
    if not isinstance(parameter_dict, dict):
        raise TypeError(
            f"load_param_into_net: 'parameter_dict' must be a dict, but got "
            f"{type(parameter_dict).__name__}."
        )
    sd = network_state(_weights_of(parameter_dict), net, source)
    try:
        result = net.load_state_dict(sd, strict=strict_load)
    except RuntimeError as exc:
        raise RuntimeError(f"load_checkpoint: {source} does not fit "
                           f"{type(net).__name__}: {exc}") from exc
    if result.missing_keys:
        log.warning("load_checkpoint: %d parameter(s) of %s are not in %s and keep their values "
                    "(e.g. %s); pass strict_load=True to refuse such a load.",
                    len(result.missing_keys), type(net).__name__, source,
                    result.missing_keys[:3])
    return list(result.missing_keys), list(result.unexpected_keys)


def load_param_into_net(
    net: Any, parameter_dict: dict, strict_load: bool = False
) -> tuple[list[str], list[str]]:
    """Load a checkpoint dict (or a plain state dict) into ``net``, a module or an optimizer.

    With ``strict_load=False`` (MindSpore's default) the parameters found are loaded, the
    others keep their values and are returned (and logged as a warning); a dict that holds
    none of ``net``'s parameters is always an error.

    A torch optimizer gets the checkpoint's optimizer state (``parameter_dict["optimizer"]``,
    or an optimizer's own ``state_dict()``): momentum, THOR's step counter and factors, as
    MindSpore's ``load_param_into_net(optimizer, param_dict)`` restores its ``global_step`` and
    moments. The state loads whole or not at all.

    The weights are lit_amp's ``"network"`` entry, Lightning's ``"state_dict"`` or the dict
    itself; a prefix such as Lightning's ``network.`` (a ``LitModel``'s attribute path) is
    removed when ``net``'s names are found under it (:func:`network_state`).

    Args:
        net: the module (or an object with ``load_checkpoint_state`` for lit_amp's files), or
            a torch optimizer.
        parameter_dict: what :func:`load_checkpoint` returned, or a state dict.
        strict_load: every parameter of ``net`` must be found, and nothing else.

    Returns:
        MindSpore's ``(param_not_load, ckpt_not_load)``: the names of ``net``'s parameters not
        found in ``parameter_dict``, and the names of the weights there that ``net`` lacks
        (under ``net``'s prefix). ``([], [])`` for an optimizer and for a whole-state load.

    Raises:
        TypeError: ``net`` is not a module or an optimizer, or ``parameter_dict`` not a dict.
        ValueError: not one of ``net``'s parameters is in ``parameter_dict`` (also with
            ``strict_load=False``: a load that loads nothing is never silent); an optimizer
            and a dict without optimizer state, or a state of another optimizer.
        RuntimeError: ``strict_load=True`` and keys are missing or unexpected, or a shape
            differs.

    Example:
        >>> net = torch.nn.Linear(2, 1)
        >>> load_param_into_net(net, {"network.weight": torch.ones(1, 2)})
        (['bias'], [])
        >>> net.weight.tolist()
        [[1.0, 1.0]]
    """
    return _load_into(net, parameter_dict, strict_load, "'parameter_dict'")
