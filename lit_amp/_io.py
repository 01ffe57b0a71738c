"""File I/O in one place: atomic writes and MindSpore's checkpoint functions (pure PyTorch).

:func:`atomic_write` is the only way lit_amp writes a file a reader may open at any moment
(checkpoints, published weights, cursors, results): the bytes go to a temp file of lit_amp's
own prefix (:data:`TMP_PREFIX`) in the target folder, are flushed and fsync-ed, renamed
over the target (atomic on POSIX) and the folder is fsync-ed, so after a crash or a power
cut the target holds either the old or the new content, never a torn one. A failed write
(full disk, I/O error) leaves the old file in place and raises an ``OSError`` naming the file
and the free space; :func:`remove_stale_temps` deletes temp files a killed process left. A
temp file is named ``.tmp-lit_amp-<target's name>.<random>`` (:func:`temp_target` reads the
target back, so a writer cleans only its own files' temps) and is locked (``flock``) while
it is written, so a cleaner never deletes the temp file of a write in progress.

One checkpoint format (issue #19): every lit_amp checkpoint is a Lightning checkpoint, a
torch-saved dict as ``Trainer.save_checkpoint`` writes it::

    {"state_dict": <the LightningModule's names: network.* for a LitModel>,
     "optimizer_states": [...], "lr_schedulers": [...], "epoch", "global_step", "loops",
     "callbacks", "pytorch-lightning_version", "hyper_parameters" (when saved),
     # lit_amp's additions:
     "lit_amp_loss_scale": <loss-scale state>, "lit_amp_boost": <AutoBoost state>,
     "append_info": {...}, "lit_amp_network_prefix": "network.", "lit_amp_format": "lit_amp/2"}

Objects that know more than their ``state_dict`` implement ``checkpoint_state()`` (a
``LitModel`` returns the dict above, built by its Trainer while one runs) and
``load_checkpoint_state(state)``; a plain module is saved as ``{"state_dict": <its own names>,
"lit_amp_network_prefix": ""}`` plus the two lit_amp keys. ``checkpoint_state()`` dicts of
the older ``{"network", "optimizer", "loss_scale", "boost"}`` shape are converted.

:func:`load_checkpoint` reads these files, Lightning's own, and lit_amp's older
``"lit_amp/1"`` files (``{"network", "optimizer", "loss_scale", "append_info", "format"}``),
and returns the file's dict with four derived views added (:func:`checkpoint_views`):
``"network"`` (the network's weights under its own names), ``"optimizer"`` (the first
optimizer's state or None), ``"loss_scale"`` (or None) and ``"append_info"`` (``{}`` if none).

Size: the atomic writer and the checkpoint format (writer, reader, views, loading into a
network) are one file format's code; splitting them would spread its rules over modules.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import IO, Any

import torch

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, the pattern alone decides
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "BOOST_KEY",
    "CHECKPOINT_FORMAT",
    "FORMAT_KEY",
    "LEGACY_FORMAT",
    "LOSS_SCALE_KEY",
    "PREFIX_KEY",
    "TMP_PREFIX",
    "atomic_write",
    "checkpoint_payload",
    "checkpoint_views",
    "load_checkpoint",
    "load_param_into_net",
    "network_state",
    "remove_stale_temps",
    "save_checkpoint",
    "temp_target",
    "write_checkpoint",
]

#: the version of lit_amp's checkpoint files (Lightning's dict plus lit_amp's keys)
CHECKPOINT_FORMAT = "lit_amp/2"
#: the version of the files of earlier releases (still read)
LEGACY_FORMAT = "lit_amp/1"
#: the key of :data:`CHECKPOINT_FORMAT` in a file
FORMAT_KEY = "lit_amp_format"
#: where the network's names start in ``state_dict`` (``"network."`` for a LitModel)
PREFIX_KEY = "lit_amp_network_prefix"
#: the loss-scale state (``LossScaleController.STATE_KEY``)
LOSS_SCALE_KEY = "lit_amp_loss_scale"
#: the ``AutoBoost`` state
BOOST_KEY = "lit_amp_boost"

#: prefix of every temp file lit_amp writes; :func:`remove_stale_temps` removes only these
TMP_PREFIX = ".tmp-lit_amp-"
#: the most characters of the target's name a temp file's name keeps (NAME_MAX is 255)
_TMP_NAME_KEEP = 200

log = logging.getLogger(__name__)

_NO_SPACE_HINTS = ("unexpected pos", "No space left", "file write failed")


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on a directory
        pass
    finally:
        os.close(fd)


def _write_failure(path: str, tmp: str, exc: BaseException) -> OSError | None:
    """An ``OSError`` naming ``path`` when ``exc`` is a full disk or an I/O error, else None."""
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code not in (errno.ENOSPC, errno.EDQUOT, errno.EIO) and not any(
        h in text for h in _NO_SPACE_HINTS
    ):
        return None
    directory = os.path.dirname(path) or "."
    free = shutil.disk_usage(directory).free
    written = os.path.getsize(tmp) if os.path.exists(tmp) else 0
    code = code if code in (errno.EDQUOT, errno.EIO) else errno.ENOSPC
    what = os.strerror(code)
    return OSError(
        code,
        f"writing {path!r} failed: {what} ({free} bytes free in {directory!r}, at least "
        f"{written} bytes needed, more than were written when it failed); the previous "
        f"content of {path!r} is unchanged. Free space or choose another directory.",
    )


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any], *,
                 fsync: bool = True) -> str:
    """Write ``path`` atomically: ``write(f)`` fills a temp file that replaces ``path``.

    Args:
        path: the target file; its folder is created if missing.
        write: called once with a binary file object open for writing.
        fsync: flush file and folder to stable storage before returning (the default;
            a checkpoint that only sits in the page cache is lost by a power cut).

    Returns:
        ``path`` as a str.

    Raises:
        OSError: the disk is full or failed (the message names the file and the free
            space); the previous content of ``path`` is kept.

    Example:
        >>> import os, tempfile
        >>> p = atomic_write(os.path.join(tempfile.mkdtemp(), "a.bin"), lambda f: f.write(b"x"))
        >>> open(p, "rb").read()
        b'x'
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    name = os.path.basename(path)[:_TMP_NAME_KEEP]
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{name}.", dir=directory)
    lock = _lock(fd)  # held until the temp file is renamed (or removed)
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
        except (OSError, RuntimeError) as exc:
            failure = _write_failure(path, tmp, exc)
            if failure is None:
                raise
            raise failure from exc
        os.replace(tmp, path)
        if fsync:
            _fsync_dir(directory)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
        if lock is not None:
            os.close(lock)
    return path


def _lock(fd: int) -> int | None:
    """Lock the temp file open at ``fd`` (a duplicate descriptor keeps the lock after the
    file object closes); the descriptor to close when done, None without ``flock``."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return os.dup(fd)
    except OSError:  # a filesystem without locks: the pattern alone protects
        return None


def _in_use(path: str) -> bool:
    """Whether a writer (this process or another) holds the lock of a temp file."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return True  # gone or unreadable: leave it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def temp_target(name: str) -> str | None:
    """The name of the file a temp file of :func:`atomic_write` was to replace, else None.

    Example:
        >>> temp_target(".tmp-lit_amp-net-1_40.ckpt.k3j_x9a"), temp_target("net-1_40.ckpt")
        ('net-1_40.ckpt', None)
    """
    if not name.startswith(TMP_PREFIX):
        return None
    target, dot, _ = name[len(TMP_PREFIX):].rpartition(".")
    return target if dot and target else None


def remove_stale_temps(directory: str | os.PathLike,
                       target: Callable[[str], bool] | None = None) -> list[str]:
    """Delete the temp files of lit_amp's prefix in ``directory`` (left by a killed writer).

    A temp file whose write is in progress (its lock is held) is kept.

    Args:
        directory: the folder (not its subfolders).
        target: only the temps whose target's name (:func:`temp_target`) it accepts; None:
            every temp file of lit_amp's prefix.

    Returns:
        The paths removed.

    Example:
        >>> import os, tempfile
        >>> d = tempfile.mkdtemp(); open(os.path.join(d, TMP_PREFIX + "x"), "w").close()
        >>> [os.path.basename(p) for p in remove_stale_temps(d)]
        ['.tmp-lit_amp-x']
    """
    directory = os.fspath(directory)
    removed: list[str] = []
    if not os.path.isdir(directory):
        return removed
    for name in os.listdir(directory):
        full = os.path.join(directory, name)
        if not name.startswith(TMP_PREFIX) or not os.path.isfile(full):
            continue
        if target is not None:
            owner = temp_target(name)
            if owner is None or not target(owner):
                continue
        if _in_use(full):
            continue
        try:
            os.remove(full)
            removed.append(full)
        except FileNotFoundError:
            pass
    return removed


def _lightning_shaped(state: dict) -> dict:
    """A ``checkpoint_state()`` dict in Lightning's shape (older ``network`` dicts converted)."""
    if "state_dict" in state or "network" not in state:
        return state
    out: dict[str, Any] = {"state_dict": state["network"], PREFIX_KEY: ""}
    renamed = {"optimizer": None, "loss_scale": LOSS_SCALE_KEY, "boost": BOOST_KEY,
               "network": None, "format": None}
    if state.get("optimizer") is not None:
        out["optimizer_states"] = [state["optimizer"]]
    for key, value in state.items():
        if key not in renamed:
            out[key] = value
        elif renamed[key] is not None and value is not None:
            out[renamed[key]] = value
    return out


def _state_of(save_obj: Any) -> dict:
    if hasattr(save_obj, "checkpoint_state"):
        return _lightning_shaped(dict(save_obj.checkpoint_state()))
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
        append_dict: extra values stored under ``"append_info"``.

    Returns:
        The path written.

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

    Example:
        >>> sorted(checkpoint_payload(torch.nn.Linear(2, 2)))
        ['append_info', 'lit_amp_format', 'lit_amp_network_prefix', 'state_dict']
    """
    state = _state_of(save_obj)
    state["append_info"] = dict(append_dict or {})
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
    return atomic_write(path, lambda f: torch.save(payload, f))


def load_checkpoint(
    ckpt_file_name: str, net: Any = None, strict_load: bool = False, *, weights_only: bool = True
) -> dict:
    """Read a checkpoint written by :func:`save_checkpoint` (or by Lightning).

    Args:
        ckpt_file_name: the file: lit_amp's (this release's or the older ``"lit_amp/1"``)
            or Lightning's (``Trainer.save_checkpoint`` / Lightning's ``ModelCheckpoint``).
        net: if given, it is loaded: an object with ``load_checkpoint_state`` (a ``LitModel``,
            ``Model.train_network``) gets the whole state (weights, optimizer, loss scale,
            boost; strictly), a plain module its weights (:func:`load_param_into_net`).
        strict_load: for a plain module, every parameter must be found and nothing else
            (MindSpore's default False loads the matching ones and warns about the others).
        weights_only: unpickle tensors and plain containers only (safe for files from
            elsewhere); pass False only for a trusted file holding arbitrary objects.

    Returns:
        The checkpoint dict with the derived views ``"network"``, ``"optimizer"``,
        ``"loss_scale"`` and ``"append_info"`` (:func:`checkpoint_views`).

    Raises:
        TypeError: ``ckpt_file_name`` is not a str path.
        ValueError: the file does not exist or is not a checkpoint, or ``net`` is given and
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
    state = checkpoint_views(state)
    if net is not None:
        _load_into(net, state, strict_load, repr(path))
    return state


def _is_checkpoint(state: dict) -> bool:
    return isinstance(state.get("state_dict"), dict) or isinstance(state.get("network"), dict)


def checkpoint_views(state: dict) -> dict:
    """``state`` (a checkpoint dict of any kind) with the derived views lit_amp's readers use.

    ``"network"``: the network's weights under its own names (a Lightning ``state_dict``
    with the prefix ``lit_amp_network_prefix`` removed; without that key, ``network.`` --
    a ``LitModel``'s -- when present, else the whole ``state_dict``); ``"optimizer"``: the
    first of ``optimizer_states`` (None if none); ``"loss_scale"``: the loss-scale state (None
    if none); ``"append_info"``: MindSpore's extra values (``{}`` if none). An older
    ``"lit_amp/1"`` dict already has them. The views share the tensors (no copy). A bare
    state dict (neither ``"state_dict"`` nor ``"network"``) is returned as it is.

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
    if isinstance(state.get("state_dict"), dict) and "network" not in state:
        sd = state["state_dict"]
        prefix = state.get(PREFIX_KEY)
        if not isinstance(prefix, str):
            prefix = "network." if any(str(k).startswith("network.") for k in sd) else ""
        out["network"] = {k[len(prefix):]: v for k, v in sd.items()
                          if isinstance(k, str) and k.startswith(prefix)}
        opts = state.get("optimizer_states") or []
        out["optimizer"] = opts[0] if opts else None
        out["loss_scale"] = state.get(LOSS_SCALE_KEY)
    out.setdefault("optimizer", None)
    out.setdefault("loss_scale", out.get(LOSS_SCALE_KEY))
    if not isinstance(out.get("append_info"), dict):
        out["append_info"] = {}
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
    for key in ("network", "state_dict"):
        if isinstance(parameter_dict.get(key), dict):
            return parameter_dict[key]
    return parameter_dict


def _load_into(net: Any, parameter_dict: dict, strict_load: bool, source: str) -> list[str]:
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
        return []
    if not isinstance(net, torch.nn.Module):
        raise TypeError(
            f"load_param_into_net: 'net' must be a torch.nn.Module, but got {type(net).__name__}."
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
    return list(result.missing_keys)


def load_param_into_net(net: Any, parameter_dict: dict, strict_load: bool = False) -> list[str]:
    """Load a checkpoint dict (or a plain state dict) into ``net``.

    With ``strict_load=False`` (MindSpore's default) the parameters found are loaded, the
    others keep their values and are returned (and logged as a warning); a dict that holds
    none of ``net``'s parameters is always an error.

    The weights are lit_amp's ``"network"`` entry, Lightning's ``"state_dict"`` or the dict
    itself; a prefix such as Lightning's ``network.`` (a ``LitModel``'s attribute path) is
    removed when ``net``'s names are found under it (:func:`network_state`).

    Args:
        net: the module (or an object with ``load_checkpoint_state`` for lit_amp's files).
        parameter_dict: what :func:`load_checkpoint` returned, or a state dict.
        strict_load: every parameter of ``net`` must be found, and nothing else.

    Returns:
        The names of ``net``'s parameters that were not found in ``parameter_dict``.

    Raises:
        TypeError: ``net`` is not a module or ``parameter_dict`` not a dict.
        ValueError: not one of ``net``'s parameters is in ``parameter_dict`` (also with
            ``strict_load=False``: a load that loads nothing is never silent).
        RuntimeError: ``strict_load=True`` and keys are missing or unexpected, or a shape
            differs.

    Example:
        >>> net = torch.nn.Linear(2, 1)
        >>> load_param_into_net(net, {"network.weight": torch.ones(1, 2)})
        ['bias']
        >>> net.weight.tolist()
        [[1.0, 1.0]]
    """
    return _load_into(net, parameter_dict, strict_load, "'parameter_dict'")
