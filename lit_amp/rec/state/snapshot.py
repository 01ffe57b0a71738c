"""Consistent snapshots of a training state, written to disk while training goes on.

A checkpoint of big embedding tables can neither be copied whole (twice the memory) nor be
written by the training loop (seconds of stall). :meth:`Snapshots.take` freezes a checkpoint
dict at one moment instead: containers copied, small tensors cloned, and a big row tensor
that only row-sparse optimizer steps (or announced row writes, e.g. an
:class:`~lit_amp.rec.modules.id_embedding.IdEmbedding`) change protected by copy-on-write
(:mod:`.copy_on_write`). :meth:`Snapshot.write` streams it into a ``torch.load``-able file
(:mod:`.storage_writer`) through :func:`lit_amp._io.atomic_write`, refusing NaN / inf weights.
With ``track_rows``, a take given the previous file's name is a row increment
(:mod:`.increments`). A protected tensor written outside a step, unannounced, breaks the
snapshot (:class:`SnapshotBroken`); that parameter is cloned in later snapshots.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import IO, Any

import numpy as np
import torch

from lit_amp._io import atomic_write
from lit_amp._pages import zeroed
from lit_amp._sparse import coalesced
from lit_amp.rec.online.guard import all_finite
from lit_amp.rec.state.copy_on_write import Protected, tensor_versions, whole_rows
from lit_amp.rec.state.increments import CHAIN_KEY, ROWS_KEY
from lit_amp.rec.state.storage_writer import Tap, as_bytes, save_by_storage, storage_order
from lit_amp.rec.state.touched import _row_local, step_rows

__all__ = ["Snapshot", "SnapshotBroken", "SnapshotStats", "Snapshots"]

#: bytes of table rows the writer copies and writes at a time
CHUNK_BYTES = 16 << 20
#: a parameter smaller than this is cloned (copy-on-write is not worth its bookkeeping)
MIN_PROTECTED_BYTES = 1 << 20
#: a table whose changed rows are more than this fraction of its rows is written whole (its
#: row indices would cost more than the rows saved)
MAX_INCREMENT_FRACTION = 0.5
_PLAIN = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device,
          torch.Size, torch.layout, torch.memory_format)


class SnapshotBroken(RuntimeError):
    """A protected tensor was written outside an optimizer step: the snapshot is not consistent."""


@dataclasses.dataclass
class SnapshotStats:
    """What writing one snapshot took.

    Attributes:
        path: the file written.
        bytes: its size.
        write_s: seconds from the start of the write to the rename (fsync included).
        cow_rows: rows copied aside because a step changed them during the write.
        cow_bytes: the bytes of those rows (over the parameter and its optimizer state).
        protected: the parameters written without a copy (copy-on-write).
    """

    path: str = ""
    bytes: int = 0
    write_s: float = 0.0
    cow_rows: int = 0
    cow_bytes: int = 0
    protected: int = 0


class Snapshot:
    """One checkpoint dict frozen at :meth:`Snapshots.take` (see the module docstring).

    Attributes:
        payload: the frozen dict (its protected tensors still share the live storages); None
            once the snapshot is written or released.
        stats: what :meth:`write` took (set by it).
    """

    def __init__(self, lock: threading.Lock | None = None, weights: str = "state_dict") -> None:
        self.payload: Any = None
        self._weights_at = f"/{weights}/"  # where the weights checked for NaN / inf sit
        self.stats = SnapshotStats()
        self._lock = lock or threading.Lock()
        self._protected: dict[int, tuple[Protected, int]] = {}  # storage -> (group, tensor)
        self._groups: dict[int, Protected] = {}  # id(param) -> group
        self._clones: dict[int, torch.UntypedStorage] = {}  # live storage -> its clone
        # storage -> the state_dict entries on it (checked for NaN / inf as they are written)
        self._weights: dict[int, list[tuple[str, torch.Tensor]]] = {}
        self._versions: dict[int, tuple[torch.Tensor, int]] = {}
        self._met: set[int] = set()  # protected storages the payload holds
        # a row increment: placeholder storage -> (group, tensor); [keys, rows] per tensor
        self._partial: dict[int, tuple[Protected, int]] = {}
        self.rows: list[list] = []
        #: whether the snapshot holds only the changed rows of some tensor (a row increment)
        self.increment = False
        self._stepping = False
        self._writing = 0  # announced row writes of a module in progress
        self._done = False
        self.broken: str | None = None

    # ------------------------------------------------------------------ freezing
    def _freeze(self, obj: Any, path: tuple) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._freeze_tensor(obj, path)
        if isinstance(obj, _PLAIN):
            return obj
        if isinstance(obj, dict):
            new = copy.copy(obj)
            for k, v in obj.items():
                new[k] = self._freeze(v, (*path, k))
            return new
        if isinstance(obj, (list, tuple)):
            items = [self._freeze(v, (*path, i)) for i, v in enumerate(obj)]
            if type(obj) is list:
                return items
            if type(obj) is tuple:
                return tuple(items)
            if isinstance(obj, tuple):  # a namedtuple
                return type(obj)(*items)
            new = copy.copy(obj)
            new[:] = items
            return new
        return copy.deepcopy(obj)

    def _freeze_tensor(self, t: torch.Tensor, keys: tuple) -> torch.Tensor:
        t = t.detach()
        if t.layout != torch.strided or t.device.type != "cpu" or type(t) is not torch.Tensor:
            return t.to("cpu", copy=True)
        path = "/" + "/".join(map(str, keys))
        key = t.untyped_storage()._cdata
        if key in self._protected:
            frozen = t  # shares the live storage; written through copy-on-write
            self._met.add(key)
            group, i = self._protected[key]
            if group.index is not None:  # only these rows: a placeholder (never touched)
                frozen = torch.empty((len(group.index), *t.shape[1:]), dtype=t.dtype)
                self._partial[frozen.untyped_storage()._cdata] = (group, i)
                self.rows.append([list(keys), group.index])
        else:
            clone = self._clones.get(key)
            if clone is None:
                clone = self._clones[key] = t.untyped_storage().clone()
            frozen = torch.empty(0, dtype=t.dtype).set_(clone, t.storage_offset(), t.size(),
                                                        t.stride())
        if path.startswith(self._weights_at) and t.is_floating_point():
            written = frozen.untyped_storage()._cdata  # what the writer will meet
            self._weights.setdefault(written, []).append((path[len(self._weights_at):], frozen))
        return frozen

    # ------------------------------------------------------------------ copy-on-write
    def _protect(self, group: Protected, key: int) -> None:
        self._groups[key] = group
        for i, t in enumerate(group.tensors):
            self._protected[t.untyped_storage()._cdata] = (group, i)
            self._versions[id(t)] = (t, t._version)

    def _settle(self) -> None:
        """After freezing: follow only the protected tensors the payload holds."""
        for key, group in list(self._groups.items()):
            keep = [t.untyped_storage()._cdata in self._met for t in group.tensors]
            for t, kept in zip(group.tensors, keep):
                if not kept:
                    del self._protected[t.untyped_storage()._cdata]
                    del self._versions[id(t)]
            if not any(keep):
                del self._groups[key]
                continue
            group.keep(keep)
            self._protected.update({t.untyped_storage()._cdata: (group, i)
                                    for i, t in enumerate(group.tensors)})

    def _changed(self) -> bool:
        return any(t._version != v for t, v in self._versions.values())

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Copy aside the rows this step of ``optimizer`` will change (under the lock)."""
        with self._lock:
            if self._done or self.broken:
                return
            self._stepping = True
            if self._changed():
                self.broken = "a protected tensor was written outside an optimizer step"
                return
            for group in optimizer.param_groups:
                for p in group["params"]:
                    prot = self._groups.get(id(p))
                    if prot is None or p.grad is None:
                        continue
                    g = p.grad
                    if g.is_sparse and g.sparse_dim() == 1:
                        if not g.is_coalesced():
                            g = p.grad = coalesced(g)  # the optimizer would coalesce it too
                        rows = g.indices()[0]
                    else:  # a dense gradient changes every row
                        rows = torch.arange(prot.rows)
                    k = prot.copy_aside(rows)
                    self.stats.cow_rows += k
                    self.stats.cow_bytes += k * prot.row_bytes

    def after_step(self) -> None:
        """The step is done: its changes are the expected ones."""
        with self._lock:
            self._stepping = False
            if not self._done:
                self._expect_current()

    def _expect_current(self) -> None:
        """The protected tensors' changes so far were announced: expect their versions now."""
        self._versions = {k: (t, t._version) for k, (t, _) in self._versions.items()}

    def row_write(self, tensors: list[torch.Tensor], rows: torch.Tensor | None) -> None:
        """A module is about to write ``rows`` of ``tensors`` outside an optimizer step: copy
        them aside (under the lock); ``rows=None``: it has written them."""
        with self._lock:
            if self._done or self.broken:
                return
            if rows is None:
                self._writing -= 1
                if not self._stepping and not self._writing:
                    self._expect_current()
                return
            if not self._stepping and not self._writing and self._changed():
                self.broken = "a protected tensor was written outside an optimizer step"
                return
            self._writing += 1
            groups = {id(g): g for g, _ in (self._protected.get(t.untyped_storage()._cdata,
                                                                (None, 0)) for t in tensors)
                      if g is not None}
            for group in groups.values():
                k = group.copy_aside(rows)
                self.stats.cow_rows += k
                self.stats.cow_bytes += k * group.row_bytes

    # ------------------------------------------------------------------ writing
    def write(self, path: str | os.PathLike, *,
              tap: Callable[[int, memoryview], Any] | None = None) -> SnapshotStats:
        """Write the snapshot to ``path`` atomically (a temp file renamed into place).

        ``tap(storage, chunk)``, if given, sees every chunk of tensor bytes as it is written,
        in file order (``storage``: the ``_cdata`` of the frozen tensor's storage): a reader of
        the file's bytes without a second pass, e.g. for a checksum.

        Returns:
            :attr:`stats`.

        Raises:
            SnapshotBroken: a protected tensor was written outside an optimizer step (nothing
                is written).
            RuntimeError: a weight holds NaN / inf (nothing is written).
            OSError: the disk is full or failed (the message names the file).
        """
        t0 = time.monotonic()
        try:
            for group in self._groups.values():
                if group.index is not None and group.member is not None:
                    np.copyto(group.index.numpy(), np.flatnonzero(group.member.numpy()),
                              casting="unsafe")
            writers = [(s.nbytes(), self._writer(s, tap)) for s in storage_order(self.payload)
                       if s.nbytes()]

            def fill(f: IO[bytes]) -> None:
                save_by_storage(f, self.payload, writers)
                with self._lock:
                    self._check_intact()  # nothing written outside a step since the last chunk

            path = atomic_write(path, fill, drop_cache=True)
        finally:
            self.release()
        self.stats.path = os.fspath(path)
        self.stats.bytes = os.path.getsize(path)
        self.stats.write_s = time.monotonic() - t0
        return self.stats

    def _writer(self, storage: torch.UntypedStorage, tap: Any = None) -> Any:
        key = storage._cdata
        weights = self._weights.get(key, [])
        if key in self._partial or key in self._protected:
            group, i = self._partial.get(key) or self._protected[key]
            name = weights[0][0] if weights else None
            return lambda f: self._write_rows(Tap(f, key, tap), group, i, name)
        return lambda f: self._write_owned(Tap(f, key, tap), storage, weights)

    def _write_owned(self, f: IO[bytes], storage: torch.UntypedStorage,
                     weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in weights:
            self._check_finite(t, name)
        data = torch.empty(0, dtype=torch.uint8).set_(storage)
        for at in range(0, len(data), CHUNK_BYTES):
            f.write(as_bytes(data[at:at + CHUNK_BYTES]))

    def _write_rows(self, f: IO[bytes], group: Protected, i: int, name: str | None) -> None:
        """Write tensor ``i`` of ``group`` as of the snapshot, chunk by chunk: every row, or
        the rows of a row increment (``group.index``)."""
        live, index = group.tensors[i], group.index
        n = group.rows if index is None else len(index)
        step = max(1, CHUNK_BYTES // max(1, live.shape[1] * live.element_size()))
        out = torch.empty(min(step, n), live.shape[1], dtype=live.dtype)
        for a in range(0, n, step):
            # copied without the lock: see Protected.overlay
            if index is None:
                rows = slice(a, min(n, a + step))
                buf = out[: rows.stop - a]
                buf.copy_(live[rows])
            else:
                rows = index[a:a + step]
                buf = torch.index_select(live, 0, rows, out=out[: len(rows)])
            with self._lock:
                self._check_intact()
                group.overlay(i, rows, buf)
            if name is not None:
                self._check_finite(buf, name)
            f.write(as_bytes(buf))

    def _check_intact(self) -> None:
        """Raise :class:`SnapshotBroken` if a protected tensor was written outside a step
        (call it under the lock; during a step, the step's pre-hook has checked)."""
        if self.broken is None and not self._stepping and not self._writing and \
                self._changed():
            self.broken = "a protected tensor was written outside an optimizer step"
        if self.broken is not None:
            raise SnapshotBroken(f"online_train: the checkpoint is abandoned: {self.broken} "
                                 "while it was being written.")

    @staticmethod
    def _check_finite(t: torch.Tensor, name: str) -> None:
        if t.is_floating_point() and not all_finite(t):
            raise RuntimeError(
                f"online_train: the checkpoint holds a non-finite value in {name!r}, so it is "
                "not written (resuming it would spread NaN); the previous checkpoint is kept. "
                "Look for a non-finite input or a diverging learning rate; loss scaling or a "
                "lower learning rate may help."
            )

    def release(self) -> None:
        """Stop following the training (the write is over): free what was copied aside and
        the frozen payload (its clones: whole tables of an ``IdEmbedding`` are gigabytes,
        which the last snapshot kept alive until the next one)."""
        with self._lock:
            self._done = True
            for group in self._groups.values():
                group.release()
            self._clones.clear()
            self._weights.clear()
            self._partial.clear()
            self.rows = []
            self.payload = None


class Snapshots:
    """Takes :class:`Snapshot` s of checkpoint dicts for a run's optimizers (hooked once).

    Args:
        optimizers: the run's torch optimizers; their steps copy rows aside while a snapshot
            is being written (``register_step_pre_hook`` / ``register_step_post_hook``).
        network: the trained module, or None. Its modules that write rows themselves and
            announce it (``register_row_write_hook``) are copied on write, their row-indexed
            buffers included; the parameters of those that change rows without announcing it
            (``take_changed_rows`` only, see :mod:`lit_amp.rec.state.touched`) are cloned.
        min_protected_bytes: parameters smaller than this are cloned (None:
            :data:`MIN_PROTECTED_BYTES`).

    Example:
        >>> import os, tempfile
        >>> emb = torch.nn.Embedding(1000, 300, sparse=True)  # 1.2 MB: copied on write
        >>> opt = torch.optim.SGD(emb.parameters(), lr=1.0)
        >>> snaps = Snapshots([opt])
        >>> snap = snaps.take({"state_dict": emb.state_dict()})
        >>> before = emb.weight.detach().clone()
        >>> emb(torch.tensor([3])).sum().backward(); opt.step()  # training goes on
        >>> path = os.path.join(tempfile.mkdtemp(), "a.ckpt")
        >>> snap.write(path).cow_rows
        1
        >>> torch.equal(torch.load(path)["state_dict"]["weight"], before)
        True
        >>> snaps.remove()
    """

    def __init__(self, optimizers: Iterable[torch.optim.Optimizer], *,
                 network: torch.nn.Module | None = None,
                 min_protected_bytes: int | None = None, track_rows: bool = False) -> None:
        self.optimizers = list(optimizers)
        self.min_protected_bytes = min_protected_bytes
        self.unprotected: set[int] = set()  # id(param) written outside a step: cloned
        self.track_rows = track_rows
        # since the last take: id(param) -> bitmap of the rows its steps changed; ids changed
        # whole; the versions of (param, moments) after its last step
        self._changed: dict[int, torch.Tensor] = {}
        self._changed_whole: set[int] = set()
        self._seen: dict[int, tuple[tuple[int, int], ...]] = {}
        self._taken = False
        self._last_id: str | None = None  # the chain id of the last take
        self._own_rows: set[int] = set()  # id(param) of modules writing rows themselves
        self._lock = threading.Lock()
        self._active: Snapshot | None = None
        self._handles = []
        self._row_modules: list[torch.nn.Module] = []  # announce their own row writes
        for m in network.modules() if network is not None else ():
            if callable(getattr(m, "register_row_write_hook", None)) or \
                    callable(getattr(m, "take_changed_rows", None)):
                self._own_rows.update(id(p) for p in m.parameters())
            if callable(getattr(m, "register_row_write_hook", None)):
                self._row_modules.append(m)
                self._handles.append(m.register_row_write_hook(self._row_write))
            elif callable(getattr(m, "take_changed_rows", None)):
                self.unprotected.update(id(p) for p in m.parameters())
        for opt in self.optimizers:
            self._handles.append(opt.register_step_pre_hook(self._pre_step))
            self._handles.append(opt.register_step_post_hook(self._post_step))

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        snap = self._active
        if snap is not None:
            snap.before_step(optimizer)
        if self.track_rows:
            self._track(optimizer)

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        snap = self._active
        if snap is not None:
            snap.after_step()
        if self.track_rows:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if id(p) in self._changed or id(p) in self._changed_whole:
                        self._seen[id(p)] = tensor_versions(self._row_tensors(optimizer, p))

    def _track(self, optimizer: Any) -> None:
        """Mark the rows this step of ``optimizer`` changes in the big tables (a sparse
        gradient under a row-local optimizer: its rows; anything else: the whole table)."""
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None or id(p) in self._own_rows or not self._big(p):
                    continue
                rows = step_rows(optimizer, group, p)
                if rows is None:
                    self._changed_whole.add(id(p))
                    continue
                bitmap = self._changed.get(id(p))
                if bitmap is None:
                    bitmap = self._changed[id(p)] = zeroed(p.shape[0], torch.bool)
                bitmap.index_fill_(0, rows, True)

    def _row_write(self, tensors: list[torch.Tensor], rows: torch.Tensor | None) -> None:
        snap = self._active
        if snap is not None:
            snap.row_write(tensors, rows)

    def _buffer_groups(self, m: torch.nn.Module) -> list[tuple[torch.Tensor, list]]:
        """``m``'s saved buffers of rows (1-D as one column), grouped by their row count:
        ``(the first buffer, its group's row views)`` for the groups worth copying on write."""
        least = MIN_PROTECTED_BYTES if self.min_protected_bytes is None else \
            self.min_protected_bytes
        groups: dict[int, tuple[torch.Tensor, list]] = {}
        for name, b in m.named_buffers(recurse=False):
            if name in m._non_persistent_buffers_set or b.dim() not in (1, 2):
                continue
            t = b.detach()
            t = t.unsqueeze(1) if t.dim() == 1 else t
            if whole_rows(t):
                groups.setdefault(t.shape[0], (b, []))[1].append(t)
        return [(b, ts) for b, ts in groups.values() if id(b) not in self.unprotected and
                sum(t.numel() * t.element_size() for t in ts) >= least]

    def take(self, payload: Any, *, weights: str = "state_dict",
             prev: str | None = None) -> Snapshot:
        """Freeze ``payload`` now; training may go on while the snapshot is written.

        Call it between optimizer steps, in the training thread, once the previous snapshot's
        :meth:`Snapshot.write` has returned. ``payload[weights]`` holds the weights checked
        for NaN / inf as they are written.

        ``prev``: the file name of the previous snapshot's checkpoint, when it was written
        whole and intact (``track_rows`` only). The snapshot is then a *row increment*
        (:attr:`Snapshot.increment`, ``payload["lit_amp_rows"]``; see
        :mod:`lit_amp.serialization`) wherever it can be: a big table (and its moments) that
        only row-local optimizer steps changed since the previous take, and nothing else, is
        written as the rows those steps changed. Everything else is written whole.
        """
        active = self._active
        if active is not None and not active._done:
            raise RuntimeError("Snapshots.take: the previous snapshot is still being written; "
                               "wait for its write (or release it) first.")
        snap = Snapshot(self._lock, weights)
        for opt in self.optimizers:
            for group in opt.param_groups:
                if not _row_local(opt, group):
                    continue
                for p in group["params"]:
                    prot = self._protectable(opt, p)
                    if prot is not None:
                        if prev is not None:
                            self._as_increment(prot, p)
                        if self.track_rows:  # the versions the next take expects
                            self._seen[id(p)] = tensor_versions(prot.tensors)
                        snap._protect(prot, id(p))
        for m in self._row_modules:
            for b, views in self._buffer_groups(m):
                snap._protect(Protected(views), id(b))
        snap.payload = snap._freeze(payload, ())
        snap._settle()
        if self.track_rows:
            snap.payload[CHAIN_KEY] = uuid.uuid4().hex
        if snap.rows:
            snap.increment = True
            snap.payload[ROWS_KEY] = {"prev": prev, "prev_id": self._last_id,
                                      "tensors": snap.rows}
        self._last_id = snap.payload.get(CHAIN_KEY)
        self._changed, self._changed_whole, self._taken = {}, set(), self.track_rows
        snap.stats.protected = len(snap._groups)
        self._active = snap
        return snap

    def _as_increment(self, prot: Protected, p: torch.Tensor) -> None:
        """Write only the rows of ``prot`` changed since the last take, if that is known: the
        table's steps were all row-local and nothing else wrote it (its versions)."""
        if not (self.track_rows and self._taken) or id(p) in self._own_rows or \
                id(p) in self._changed_whole or id(p) not in self._seen or \
                self._seen[id(p)] != tensor_versions(prot.tensors):
            return
        bitmap = self._changed.get(id(p))
        if bitmap is None:
            bitmap = zeroed(p.shape[0], torch.bool)
        count = int(np.count_nonzero(bitmap.numpy()))
        if count > MAX_INCREMENT_FRACTION * p.shape[0]:
            return
        # filled by the writer (Snapshot.write): finding the rows of a 26 M-row bitmap takes
        # 20 ms with numpy (150 ms with torch), too long for the loop
        wide = p.shape[0] > torch.iinfo(torch.int32).max
        prot.index = torch.empty(count, dtype=torch.int64 if wide else torch.int32)
        prot.member = bitmap

    def _row_tensors(self, opt: torch.optim.Optimizer, p: torch.Tensor) -> list[torch.Tensor]:
        """``p`` and its optimizer state of the same shape (what a snapshot protects)."""
        state = opt.state.get(p, {})
        return [p.detach()] + [t.detach() for t in state.values()
                               if isinstance(t, torch.Tensor) and t.shape == p.shape
                               and whole_rows(t)]

    def _big(self, p: torch.Tensor) -> bool:
        """Whether ``p`` is a table worth copying on write (else it is cloned)."""
        least = MIN_PROTECTED_BYTES if self.min_protected_bytes is None else \
            self.min_protected_bytes
        return id(p) not in self.unprotected and whole_rows(p) and \
            p.numel() * p.element_size() >= least

    def _protectable(self, opt: torch.optim.Optimizer, p: torch.Tensor) -> Protected | None:
        if not self._big(p):
            return None
        return Protected(self._row_tensors(opt, p))

    def broken(self, snap: Snapshot) -> None:
        """``snap`` was broken by a write outside a step: clone its parameters from now on."""
        self.unprotected.update(snap._groups)

    def remove(self) -> None:
        """Unhook the optimizers (call it in the training thread)."""
        self._active = None
        for h in self._handles:
            h.remove()
        self._handles = []
