"""Reading published weights: :func:`load_published` and :func:`latest_published`.

A server polls :func:`load_published`. For the delta layout it loads the newest readable
full snapshot at or before ``LATEST``'s version and replays the deltas after it in order,
refusing a torn (checksum), missing, out-of-order or foreign one: the result is then the
version before it, and a warning names the file and why. Every file loads with
``torch.load(weights_only=True)``; formats: :mod:`lit_amp.rec.serving.format`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from lit_amp.rec.serving.format import DELTA_FORMAT, VERSIONED, checksum, versions

__all__ = ["load_published", "latest_published"]

log = logging.getLogger(__name__)


def latest_published(publish_dir: str | os.PathLike) -> str | None:
    """The path ``LATEST`` names, or None when nothing was published yet.

    Example:
        >>> import tempfile
        >>> latest_published(tempfile.mkdtemp()) is None
        True
    """
    directory = os.fspath(publish_dir)
    try:
        with open(os.path.join(directory, "LATEST")) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    return os.path.join(directory, name) if name else None


def _torch_load(path: str) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle.UnpicklingError, a truncated zip, a missing file...
        raise ValueError(
            f"load_published: the published weights {path!r} cannot be read "
            f"({type(exc).__name__}: {exc})."
        ) from exc


def load_published(
    publish_dir: str | os.PathLike,
    network: torch.nn.Module | None = None,
    *,
    since: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Load the newest published weights (what ``LATEST`` names), optionally into ``network``.

    For the delta layout (:class:`~lit_amp.rec.serving.writer.DeltaPublisher`) the newest
    readable full snapshot at or before ``LATEST``'s version is loaded and the deltas after it
    are applied in order; a delta that is torn (checksum), missing, out of order or of another
    chain is refused with a warning, and the result is the version before it. With ``since``
    (what an earlier call returned) only the deltas after ``since``'s version are read and
    applied — to ``network`` and to ``since``'s tensors, in place — when they continue its
    chain; a new full snapshot is loaded whole.

    Args:
        publish_dir: the folder the publisher writes.
        network: a module to load the weights into, or None.
        since: a dict this function returned before, to poll for newer versions cheaply.

    Returns:
        The published dict (``"network"``: the whole state, ``"step"``, ``"records"``,
        ``"published_at"``; for the delta layout also ``"version"``, ``"full"`` (the full
        snapshot's version), ``"chain"`` and ``"refused"`` (the refused file and why, or
        None)). ``since`` itself when nothing newer was published; after deltas, a new dict
        sharing ``since``'s (updated) tensors.

    Raises:
        ValueError: nothing was published in ``publish_dir``, or no full snapshot (full
            layout: the file ``LATEST`` names) can be read.

    Example:
        >>> import tempfile
        >>> from lit_amp.rec.serving.writer import publish_weights
        >>> d = tempfile.mkdtemp()
        >>> _ = publish_weights(torch.nn.Linear(2, 1), d, step=3, records=300)
        >>> serving = torch.nn.Linear(2, 1)
        >>> load_published(d, serving)["records"]
        300
    """
    path = latest_published(publish_dir)
    if path is None:
        raise ValueError(
            f"load_published: no published weights in {os.fspath(publish_dir)!r} (no LATEST)."
        )
    m = VERSIONED.match(os.path.basename(path))
    if m is not None:
        return _load_versioned(os.path.dirname(path), int(m.group(2)), network, since)
    payload = _torch_load(path)
    if not isinstance(payload, dict) or "network" not in payload:
        raise ValueError(f"load_published: {path!r} does not hold published weights.")
    if network is not None:
        network.load_state_dict(payload["network"])
    return payload


def _load_versioned(directory: str, head: int, network: Any, since: dict | None) -> dict:
    full_files, deltas = versions(directory)
    fulls = sorted((v for v in full_files if v <= head), reverse=True)
    # a full snapshot newer than ``since`` may start a new chain: then it is loaded whole
    if since is not None and since.get("format") == DELTA_FORMAT and fulls and \
            fulls[0] <= since.get("version", -1) <= head:
        if since["version"] == head:
            return since
        # a new dict (``since``'s version stays as it was); the tensors are updated in place
        return _replay(directory, deltas, {**since, "refused": None}, head, network)
    errors = []
    for full in fulls:
        name = full_files[full]
        try:
            payload = _read_versioned(directory, name, "full", full)
        except ValueError as exc:
            log.warning("load_published: the full snapshot %s is refused (%s); trying the "
                        "previous one.", name, exc)
            errors.append(f"{name}: {exc}")
            continue
        if network is not None:
            network.load_state_dict(payload["network"])
            payload["network"] = network.state_dict()  # the network's own tensors
        payload["refused"] = None
        return _replay(directory, deltas, payload, head, network)
    raise ValueError(
        f"load_published: no readable full snapshot at or before version {head} in "
        f"{directory!r} ({'; '.join(errors)[:2000] or 'none found'})."
    )


def _read_versioned(directory: str, name: str, kind: str, version: int) -> dict:
    """A versioned file, checked: its format, kind, version and checksum."""
    payload = _torch_load(os.path.join(directory, name))
    if not isinstance(payload, dict) or payload.get("format") != DELTA_FORMAT or \
            not isinstance(payload.get("network"), dict) or \
            not isinstance(payload.get("rows"), dict):
        raise ValueError(f"{name} is not a {DELTA_FORMAT} file")
    if payload.get("kind") != kind or payload.get("version") != version:
        raise ValueError(f"{name} holds {payload.get('kind')} version "
                         f"{payload.get('version')}, not {kind} version {version}")
    expected = payload.get("checksum")
    if expected is None and kind == "full":  # written in the background: beside the file
        expected = _sidecar_checksum(os.path.join(directory, name + ".crc"), name)
    try:
        crc = checksum(payload)
    except Exception as exc:  # a value of the wrong type in a crafted file
        raise ValueError(f"{name} cannot be checked ({type(exc).__name__}: {exc})") from exc
    if crc != expected:
        raise ValueError(f"{name} fails its checksum (torn or altered)")
    return payload


def _sidecar_checksum(path: str, name: str) -> int:
    try:
        with open(path, "rb") as f:
            return int(f.read(32).decode().strip())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{name} has no readable checksum file ({exc})") from exc


def _replay(directory: str, deltas: dict, payload: dict, head: int, network: Any) -> dict:
    """Apply the deltas after ``payload``'s version up to ``head`` in order; stop at the
    first one that is missing, unreadable or does not continue the chain."""
    loaders = _row_loaders(network)
    while payload["version"] < head:
        v = payload["version"] + 1
        name = deltas.get(v, f"delta-{v:012d}.pt")
        try:
            if v not in deltas:
                raise ValueError(f"{name} is missing")
            delta = _read_versioned(directory, name, "delta", v)
            _check_delta(delta, payload, name)
        except ValueError as exc:
            payload["refused"] = str(exc)
            log.warning(
                "load_published: delta version %d refused: %s; serving version %d (full "
                "snapshot %d + %d deltas) instead of %d.",
                v, exc, payload["version"], payload["full"],
                payload["version"] - payload["full"], head,
            )
            return payload
        with torch.no_grad():
            for key, values in delta["network"].items():
                rows = delta["rows"].get(key)
                if key in loaders:
                    module, local = loaders[key]
                    module.load_rows(local, rows, values)
                elif rows is None:
                    payload["network"][key].copy_(values)
                else:
                    payload["network"][key].index_copy_(0, rows, values)
        for k in ("version", "step", "records", "published_at"):
            payload[k] = delta[k]
    return payload


def _check_delta(delta: dict, payload: dict, name: str) -> None:
    """Refuse a delta that does not continue ``payload``'s chain or does not fit its tensors
    (checked whole before any of it is applied: a delta is applied entirely or not at all)."""
    if delta.get("chain") != payload["chain"] or delta.get("base") != payload["version"]:
        raise ValueError(
            f"{name} does not continue version {payload['version']} of full snapshot "
            f"{payload['full']} (it applies to version {delta.get('base')} of full snapshot "
            f"{delta.get('full')}, chain {str(delta.get('chain'))[:8]})"
        )
    state = payload["network"]
    for key, values in delta["network"].items():
        target = state.get(key)
        rows = delta["rows"].get(key)
        if target is None or not torch.is_tensor(values) or values.dtype != target.dtype:
            raise ValueError(f"{name}: {key!r} does not match the published state")
        if rows is None:
            ok = values.shape == target.shape
        else:
            ok = (torch.is_tensor(rows) and rows.dtype == torch.long and rows.dim() == 1
                  and values.shape == (rows.numel(), *target.shape[1:])
                  and (rows.numel() == 0 or (int(rows.min()) >= 0
                                             and int(rows.max()) < target.shape[0])))
        if not ok:
            raise ValueError(f"{name}: the rows of {key!r} do not fit the published state")


def _row_loaders(network: Any) -> dict[str, tuple[Any, str]]:
    """``{state key: (module, local name)}`` for the tensors a module loads by rows itself
    (``load_rows``: e.g. an id map that keeps a hash table beside its rows)."""
    if network is None:
        return {}
    out = {}
    for prefix, m in network.named_modules():
        if callable(getattr(m, "load_rows", None)):
            p = f"{prefix}." if prefix else ""
            for local in m.row_state:
                out[p + local] = (m, local)
    return out
