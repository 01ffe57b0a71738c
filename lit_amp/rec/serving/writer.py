"""Writing published weights: :func:`publish_weights` (full layout) and :class:`DeltaPublisher`.

Every file is written with :func:`lit_amp._io.atomic_write` before ``LATEST`` names it
(layouts: :mod:`lit_amp.rec.serving.format`). :class:`DeltaPublisher` writes a version as the
rows its optimizers changed (:class:`~lit_amp.rec.state.touched.TouchedRows`), so a delta's
size follows the rows a stream touched, not the table size; with ``background``, deltas and
full snapshots are written by :class:`~lit_amp._io.BackgroundJobs` while training goes on.
Non-finite values are never published; old chains are pruned (:func:`lit_amp._io.prune_newest`).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from typing import Any

import torch

from lit_amp._io import BackgroundJobs, atomic_write, prune_newest
from lit_amp._validation import check_bool, check_int, check_number
from lit_amp.rec.online.guard import all_finite
from lit_amp.rec.serving.format import (
    DELTA_FORMAT,
    HEADER,
    PUBLISH_FORMAT,
    PUBLISHED,
    VERSIONED,
    byte_size,
    checksum,
    versions,
)
from lit_amp.rec.serving.full_snapshots import BackgroundFullWriter, streamable
from lit_amp.rec.state.snapshot import SnapshotBroken
from lit_amp.rec.state.touched import MarkedRows, TouchedRows

__all__ = ["publish_weights", "DeltaPublisher"]

log = logging.getLogger(__name__)


def _cpu_state(network: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``network``'s state on the CPU (CPU tensors are not copied: the file is written before
    the next training step changes them)."""
    return {k: v.detach().cpu() for k, v in network.state_dict().items()}


def _write_latest(directory: str, name: str) -> None:
    atomic_write(os.path.join(directory, "LATEST"), lambda f: f.write((name + "\n").encode()))


def publish_weights(
    network: torch.nn.Module,
    publish_dir: str | os.PathLike,
    step: int,
    *,
    records: int = 0,
    keep: int = 3,
    extra: dict[str, Any] | None = None,
) -> str:
    """Export ``network``'s weights atomically as ``model-{step}.pt`` and point ``LATEST`` at it.

    Args:
        network: the module to export (its ``state_dict``, copied to CPU).
        publish_dir: the folder (created if missing).
        step: the training step the weights come from.
        records: records trained so far (stored in the file).
        keep: how many published files to keep (older ones are deleted).
        extra: more values to store in the file.

    Returns:
        The path of the new file.

    Example:
        >>> import tempfile
        >>> from lit_amp.rec.serving.reader import load_published
        >>> d = tempfile.mkdtemp()
        >>> p = publish_weights(torch.nn.Linear(2, 1), d, step=7)
        >>> os.path.basename(p), load_published(d)["step"]
        ('model-000000000007.pt', 7)
    """
    directory = os.fspath(publish_dir)
    os.makedirs(directory, exist_ok=True)
    payload = {
        "network": {k: v.detach().to("cpu", copy=True) for k, v in network.state_dict().items()},
        "step": int(step),
        "records": int(records),
        "published_at": time.time(),
        "format": PUBLISH_FORMAT,
        **(extra or {}),
    }
    name = f"model-{int(step):012d}.pt"
    path = os.path.join(directory, name)
    atomic_write(path, lambda f: torch.save(payload, f))
    _write_latest(directory, name)
    prune_newest(directory, lambda n: PUBLISHED.match(n) and n != name, keep - 1)
    return path


class DeltaPublisher:
    """Publishes ``network`` as numbered versions: full snapshots and the deltas between them.

    The first publish of a publisher is a full snapshot (a restart cannot know what changed
    before it, so it starts a new chain); then every publish writes a delta of the rows
    changed since the previous version. Every ``full_every_n_publishes``-th publish, and a
    publish whose delta would be larger than ``max_delta_fraction`` of a full snapshot, also
    writes a full snapshot of the same version in the same chain, so that a new reader
    replays few deltas. Versions continue the numbers found in ``publish_dir``. After a full
    snapshot, the files older than the newest ``keep_full_max`` full snapshots are deleted.

    With ``background=True`` a full snapshot is written in a thread while training goes on
    (:class:`~lit_amp.rec.serving.full_snapshots.BackgroundFullWriter`); the publish that starts it
    writes the delta of its version too (so readers stay fresh during the write), unless
    that delta is the oversized kind. ``LATEST`` names a version only once a full snapshot
    at or before it in the chain is on disk; a full snapshot due while another is being
    written waits for the next publish after it. A delta is then written by a thread too:
    its whole tensors are cloned in the loop, its rows gathered by that thread while the
    next step's forward and backward run (the next optimizer step waits for the gather, so
    the rows are those of the published step; a tracked tensor written outside an optimizer
    step meanwhile abandons that delta, and its rows go into the next one). Deltas are
    written one at a time, the next publish waiting for the previous one. :meth:`poll`
    (called between steps), the next publish or :meth:`close` moves ``LATEST`` to it once
    it is on disk. A delta whose write failed is rolled back: its error is raised by the
    next :meth:`poll`, publish or :meth:`close`, and the next publish writes its version
    again with its rows.

    Each version is named by ``LATEST`` in turn, oldest first (versions that landed behind
    a full snapshot still being written are named one after the other once it is on disk),
    and as each is named it is listed in :attr:`landed` and passed to ``on_named``; a
    version whose write failed is never named.

    Rows are tracked from the gradients (:class:`~lit_amp.rec.state.touched.TouchedRows`): every
    optimizer that steps ``network`` must be passed to :meth:`attach`.

    Args:
        network: the module to publish.
        publish_dir: the folder (created if missing).
        full_every_n_publishes: a full snapshot every this many publishes.
        max_delta_fraction: a delta larger than this fraction of a full snapshot's bytes is
            replaced by a full snapshot.
        keep_full_max: full snapshots kept, each with its deltas (at least 2 keeps a reader
            that is replaying the previous chain safe from the pruning).
        background: write full snapshots and deltas in threads (call :meth:`close` at the
            end).
        on_named: called as ``on_named(version, path, bytes)`` once ``path``, the file of
            ``version``, is on disk and ``LATEST`` names it (in the calling thread: from a
            publish, :meth:`poll` or :meth:`close`), or None.

    Raises:
        TypeError / ValueError: an argument of the wrong type or out of range.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> emb = torch.nn.Embedding(10_000, 8, sparse=True)
        >>> opt = torch.optim.SparseAdam(emb.parameters())
        >>> pub = DeltaPublisher(emb, d)
        >>> pub.attach(opt)
        >>> os.path.basename(pub.publish(step=1))
        'full-000000000001.pt'
        >>> emb(torch.tensor([5, 42])).sum().backward(); opt.step()
        >>> os.path.basename(pub.publish(step=2)), pub.last_rows
        ('delta-000000000002.pt', 2)
        >>> from lit_amp.rec.serving.reader import load_published
        >>> load_published(d)["version"]
        2
    """

    def __init__(
        self,
        network: torch.nn.Module,
        publish_dir: str | os.PathLike,
        *,
        full_every_n_publishes: int = 50,
        max_delta_fraction: float = 0.25,
        keep_full_max: int = 2,
        background: bool = False,
        on_named: Callable[[int, str, int], None] | None = None,
    ) -> None:
        owner = "DeltaPublisher"
        self.full_every = check_int(owner, "full_every_n_publishes", full_every_n_publishes,
                                    minimum=1)
        self.max_fraction = check_number(owner, "max_delta_fraction", max_delta_fraction,
                                         minimum=0.0, maximum=1.0)
        self.keep_full = check_int(owner, "keep_full_max", keep_full_max, minimum=1)
        self.background = check_bool(owner, "background", background)
        self.network = network
        self.on_named = on_named
        self.directory = os.fspath(publish_dir)
        self.touched = TouchedRows(network)
        self._optimizers: list[torch.optim.Optimizer] = []
        self._writer: BackgroundFullWriter | None = None
        fulls, deltas = versions(self.directory)
        self.version = max([*fulls, *deltas], default=0)  # the newest version on disk
        self.full_version: int | None = None  # this chain's newest full snapshot on disk
        self.chain: str | None = None
        self.deltas_since_full = 0
        # the versions on disk that LATEST has not named yet: version -> (file name, bytes)
        self._unnamed: dict[int, tuple[str, int]] = {}
        self._named = 0  # the newest version LATEST named
        # a version whose only file is a full snapshot still being written: LATEST waits
        self._hold: int | None = None
        #: what the last publish wrote in the loop: "full" or "delta", its size and rows
        self.last_kind: str | None = None
        self.last_bytes = 0
        self.last_rows = 0
        # background: the delta being written, noted (version, changes, full too)
        self._deltas = BackgroundJobs("lit_amp-publish-delta")
        # set once the background delta's rows are gathered; optimizer steps wait for it
        self._gathering: threading.Event | None = None
        # gather the rows in the loop: the network changes rows outside optimizer steps
        # (a module with take_changed_rows), or a tensor was written outside one
        self._gather_in_loop = bool(self.touched.row_modules)
        self._handles: list[Any] = []
        #: the versions named by ``LATEST`` (on disk), oldest first: ``(version, path,
        #: bytes)`` (the newest 64; a caller may empty it)
        self.landed: collections.deque[tuple[int, str, int]] = collections.deque(maxlen=64)

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Track the rows ``optimizer`` changes (see :class:`TouchedRows`)."""
        self.touched.attach(optimizer)
        self._optimizers.append(optimizer)
        self._handles.append(optimizer.register_step_pre_hook(self._before_step))

    def detach(self) -> None:
        """Unhook the optimizers."""
        self.touched.detach()
        for h in self._handles:
            h.remove()
        self._handles = []

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """An optimizer step changes rows: the background delta's gather finishes first."""
        gathering = self._gathering
        if gathering is not None:
            gathering.wait()
            self._gathering = None

    def publish(self, step: int, *, records: int = 0, extra: dict[str, Any] | None = None) -> str:
        """Write the next version (a delta, a full snapshot or both), then point ``LATEST`` at
        it once a full snapshot of its chain is on disk.

        Returns:
            The path of the file written in the loop (the delta when there is one; with
            ``background``, that delta or a full snapshot may not be on disk yet).

        Raises:
            OSError: the write failed; ``LATEST`` still names the previous version, and the
                next publish covers the rows this one would have. A background full
                snapshot's failure is raised by the next publish (or :meth:`close`).
            RuntimeError: a value to write is NaN / inf (nothing is written).
        """
        self._collect()
        self._collect_delta(wait=True)
        # a background writer lists the rows of its delta (the loop only counts them)
        changes = self.touched.take(lazy=self.background and not self._gather_in_loop)
        try:
            return self._publish(changes, step, records, extra)
        except BaseException:
            self.touched.mark(changes)
            raise

    def _publish(self, changes: dict, step: int, records: int, extra: dict | None) -> str:
        state = _cpu_state(self.network)
        version = self.version + 1
        header = {"format": DELTA_FORMAT, "version": version, "step": int(step),
                  "records": int(records)}
        busy = self._writer is not None and self._writer.busy()
        want_full = self.chain is None or self.deltas_since_full + 1 >= self.full_every
        delta = None
        # written in the loop, a due full snapshot is this version: no delta to build
        if self.chain is not None and not (want_full and not busy and not self.background):
            # in the background, the delta's rows are gathered by its writer thread
            later = self.background and not self._gather_in_loop
            delta = _delta_of(state, changes, self.touched.train_state, gather=not later)
            full_bytes = sum(byte_size(t) for t in state.values())
            size = _delta_bytes(state, delta)
            if size > self.max_fraction * full_bytes and not busy:
                delta, want_full = None, True
        full = want_full and not busy
        if full and not self.background:
            delta = None  # the full snapshot, written now, is this version
        chain = uuid.uuid4().hex if self.chain is None else self.chain
        extra = {"published_at": time.time(), **(extra or {})}
        path = later = None
        if delta is not None:
            payload = {**header, "kind": "delta", "base": self.version,
                       "full": self.full_version, "chain": chain,
                       "network": delta[0], "rows": delta[1], **extra}
            if self.background:  # started once nothing else of this publish can fail
                path, later = self._delta_copy(payload, version, state), payload
            else:
                path = self._write(payload, version)
            self.deltas_since_full += 1
        if full:
            kind, nbytes, rows = self.last_kind, self.last_bytes, self.last_rows
            payload = {**header, "kind": "full", "base": None, "full": version, "chain": chain,
                       "network": dict(sorted(state.items())), "rows": {}, **extra}
            full_path = self._write_full(payload, version)
            if path is None:
                path = full_path
                if self._writer is not None and self._writer.pending is not None and \
                        self._hold is None:
                    self._hold = version  # no delta of this version until the full lands
            else:  # the delta is what this publish wrote in the loop
                self.last_kind, self.last_bytes, self.last_rows = kind, nbytes, rows
        if later is not None:
            self._start_delta(later, path, version, changes, full, state)
        self.version, self.chain = version, chain
        self._move_latest()
        return path

    def _write(self, payload: dict, version: int) -> str:
        """Check and write a versioned file now; remember it as the chain's newest."""
        _refuse_nonfinite(payload["network"], version)
        name = f"{payload['kind']}-{version:012d}.pt"
        path = os.path.join(self.directory, name)
        nbytes = self._write_file(payload, path)
        self._unnamed[version] = (name, nbytes)
        self.last_kind, self.last_bytes = payload["kind"], nbytes
        self.last_rows = sum(int(r.numel()) for r in payload["rows"].values())
        return path

    def _delta_copy(self, payload: dict, version: int, state: dict) -> str:
        """Check a delta's whole tensors now and clone them (the training's to change no
        more); its rows are copies already, or gathered later by the writer thread (None
        here). Returns the path it will be written to."""
        rows = payload["rows"]
        _refuse_nonfinite({k: t for k, t in payload["network"].items() if t is not None},
                          version)
        payload["network"] = {k: t if k in rows else t.clone()
                              for k, t in payload["network"].items()}
        self.last_kind = "delta"
        self.last_bytes = _delta_bytes(state, (payload["network"], rows))
        self.last_rows = sum(int(r.numel()) for r in rows.values())
        return os.path.join(self.directory, f"delta-{version:012d}.pt")

    def _start_delta(self, payload: dict, path: str, version: int, changes: dict,
                     full_too: bool, state: dict) -> None:
        """Write the delta ``_delta_copy`` made in the background thread, gathering its rows
        there first if they are not gathered yet (the next optimizer step waits for that)."""
        net = payload["network"]
        live = {k: state[k] for k in payload["rows"] if net[k] is None}
        gathered = None
        if live:
            gathered = self._gathering = threading.Event()
        self._deltas.submit(self._gather_and_write, payload, path, version, live,
                            {k: t._version for k, t in live.items()}, gathered,
                            note=(version, changes, full_too))

    @classmethod
    def _gather_and_write(cls, payload: dict, path: str, version: int,
                          live: dict[str, torch.Tensor], versions: dict[str, int],
                          gathered: threading.Event | None) -> int:
        """The writer thread: gather the rows of ``live`` tensors (then let the optimizer
        step), check them, write the delta; returns its size."""
        try:
            for key, t in live.items():
                rows = payload["rows"][key]
                if isinstance(rows, MarkedRows):  # torch.nonzero: the GIL is released
                    rows = payload["rows"][key] = rows.rows()
                payload["network"][key] = t.index_select(0, rows)
            written = sorted(k for k, t in live.items() if t._version != versions[k])
        finally:
            if gathered is not None:
                gathered.set()
        if written:
            raise _RowsWritten(version, written)
        _refuse_nonfinite({k: payload["network"][k] for k in live}, version)
        return cls._write_file(payload, path)

    @staticmethod
    def _write_file(payload: dict, path: str) -> int:
        """Checksum ``payload`` and write it atomically (in the loop, or in the background
        thread for a delta); returns the file's size."""
        payload["checksum"] = checksum(payload)
        atomic_write(path, lambda f: torch.save(payload, f))
        return os.path.getsize(path)

    def _collect_delta(self, wait: bool = False) -> None:
        """Land the background delta if it is written (or ``wait`` for it): ``LATEST`` moves
        to it. A failed one is rolled back (its rows marked again; its version, unless a
        full snapshot holds it, written again by the next publish) and its error raised."""
        done = self._deltas.take(wait)
        if done is None:
            return
        future, (version, changes, full_too) = done
        error = future.exception()
        if error is None:
            self._unnamed[version] = (f"delta-{version:012d}.pt", future.result())
            self._move_latest()
            return
        self.touched.mark(changes)
        if not full_too and self.version == version:
            self.version -= 1
            self.deltas_since_full = max(0, self.deltas_since_full - 1)
        if isinstance(error, _RowsWritten):
            self._gather_in_loop = True
            log.warning("%s The next publish writes its rows; from now on rows are gathered "
                        "in the training loop.", error)
            return
        raise error

    def writing(self, version: int) -> bool:
        """Whether the delta of ``version`` is being written in the background (not landed)."""
        pending = self._deltas.pending
        return pending is not None and pending[1][0] == version

    def poll(self, wait: bool = False) -> None:
        """Land what the background writers finished (between steps; cheap when nothing
        did), or ``wait`` for the delta being written. Raises a failed write's error (see
        the class docstring)."""
        self._collect()
        self._collect_delta(wait)

    def _write_full(self, payload: dict, version: int) -> str:
        self.deltas_since_full = 0
        if not self.background or not streamable(payload["network"]):
            path = self._write(payload, version)
            self._full_written(version)
            return path
        if self._writer is None:
            self._writer = BackgroundFullWriter(self._optimizers, self.network)
        name = f"full-{version:012d}.pt"
        path = os.path.join(self.directory, name)
        payload["checksum"] = None  # in <name>.crc, computed as the file is written
        crc = zlib.crc32(repr([payload.get(k) for k in HEADER]).encode())
        self._writer.start(payload, crc, version, path)
        self.last_kind, self.last_rows = "full", 0
        self.last_bytes = sum(byte_size(t) for t in payload["network"].values())
        return path

    def _full_written(self, version: int, nbytes: int | None = None) -> None:
        self.full_version = version
        if self._hold is not None and version >= self._hold:
            self._hold = None
        name = f"full-{version:012d}.pt"
        if nbytes is not None:  # written in the background (``_write`` lists one in the loop)
            self._unnamed.setdefault(version, (name, nbytes))
        self._prune()

    def _move_latest(self) -> None:
        """Point ``LATEST`` at each version on disk in turn, oldest first, once a full
        snapshot of the chain is under it (and none held back, see ``_hold``); list each in
        :attr:`landed` and pass it to ``on_named`` while ``LATEST`` names it."""
        if self.full_version is None:
            return
        for version in sorted(self._unnamed):
            if self._hold is not None and version >= self._hold:
                return
            name, nbytes = self._unnamed.pop(version)
            if version <= self._named or version < self.full_version:
                continue  # its other file was named, or no full snapshot is under it
            _write_latest(self.directory, name)
            self._named = version
            path = os.path.join(self.directory, name)
            self.landed.append((version, path, nbytes))
            if self.on_named is not None:
                self.on_named(version, path, nbytes)

    def _collect(self, wait: bool = False) -> None:
        """Take the result of the background full snapshot, if it is done (or ``wait``)."""
        done = None if self._writer is None else self._writer.collect(wait)
        if done is None:
            return
        version, path, error = done
        if error is None:
            self._full_written(version, os.path.getsize(path))
            self._move_latest()
            return
        self.deltas_since_full = self.full_every  # the next publish starts another one
        if isinstance(error, SnapshotBroken):
            self._writer.broken()
            log.warning("DeltaPublisher: the full snapshot %s was abandoned (%s); the next "
                        "publish writes another.", os.path.basename(path), error)
            return
        raise error

    def close(self) -> None:
        """Wait for the delta and the full snapshot being written, point ``LATEST`` at the
        newest version, and stop the background writers (a no-op without them). Raises a
        failure, if any."""
        try:
            self._collect_delta(wait=True)
        finally:
            self._deltas.close()
            if self._writer is not None:
                try:
                    self._collect(wait=True)
                finally:
                    self._writer.close()
                    self._writer = None

    def _prune(self) -> None:
        """Keep the newest ``keep_full`` full snapshots and the deltas after the oldest one."""
        def version(n: str) -> int:
            return int(VERSIONED.match(n).group(2))

        if len(versions(self.directory)[0]) <= self.keep_full:
            return
        kept = prune_newest(self.directory, r"full-\d+\.pt", self.keep_full, key=version,
                            also=lambda n: [n + ".crc"])
        if kept:
            prune_newest(self.directory,
                         lambda n: n.startswith("delta-") and VERSIONED.match(n) and
                         version(n) < version(kept[0]), 0)


def _refuse_nonfinite(tensors: dict[str, torch.Tensor], version: int) -> None:
    for key, t in tensors.items():
        if t.is_floating_point() and not all_finite(t):
            raise RuntimeError(
                f"DeltaPublisher: version {version} holds a non-finite value in {key!r}, so it "
                "is not published (serving it would spread NaN); LATEST still names the "
                "previous version. Look for a non-finite input or a diverging learning rate."
            )


def _delta_of(state: dict, changes: dict, train_state: set[str], *,
              gather: bool = True) -> tuple[dict, dict]:
    """``(values, rows)`` of a delta: the changed rows of row-tracked tensors (None when not
    ``gather``: gathered later), whole others."""
    values, rows = {}, {}
    for key, r in changes.items():
        if key not in state or key in train_state:
            continue
        if r is None:
            values[key] = state[key]
        else:
            if gather and isinstance(r, MarkedRows):
                r = r.rows()
            rows[key] = r
            values[key] = state[key].index_select(0, r) if gather else None
    return values, rows


def _delta_bytes(state: dict, delta: tuple[dict, dict]) -> int:
    """The bytes of a delta's tensors and row indices (rows not gathered yet counted too)."""
    values, rows = delta
    size = sum(8 * len(r) if isinstance(r, MarkedRows) else byte_size(r) for r in rows.values())
    for key, t in values.items():
        if t is None:  # len(rows) rows of the table
            t = state[key]
            size += byte_size(t) // max(1, t.shape[0]) * len(rows[key])
        else:
            size += byte_size(t)
    return size


class _RowsWritten(RuntimeError):
    """A row-tracked tensor was written outside an optimizer step while a background delta's
    rows were gathered: that delta is abandoned (its rows go into the next one)."""

    def __init__(self, version: int, keys: list[str]) -> None:
        super().__init__(
            f"DeltaPublisher: version {version} was not written: {', '.join(map(repr, keys))} "
            "changed outside an optimizer step while its rows were being copied.")
