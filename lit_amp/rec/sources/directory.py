"""``DirectorySource``: tail a folder that producers fill with files (the embedded default).

Producers write a file under a hidden name, then rename it into the folder
(:func:`~lit_amp.rec.sources.shards.write_shard`); the source reads only names that are not
hidden and end with one of ``suffixes``, so it never sees half a file. Files are read in name
order; the cursor is the *set* of consumed files, so a file landing late with a smaller name is
still read. Only regular files are read: a symbolic link is never followed, it is dead-lettered
once and skipped, as are FIFOs, sockets and folders. The stream ends when ``end_marker``
exists and every file of this shard is consumed, or after ``max_idle_s`` without a new file.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from lit_amp.rec.sources.base import StreamSource, check_source_args, resolve_shard
from lit_amp.rec.sources.deleter import Deleter, identity
from lit_amp.rec.sources.schema import ClickSchema, Columns
from lit_amp.rec.sources.shards import FORMATS, parse_shard, shard_of

__all__ = ["DirectorySource"]

log = logging.getLogger(__name__)

_MAX_SHARD_BYTES = 256 << 20  # default DirectorySource(max_shard_bytes=...)
_READ_TRIES = 4  # attempts at reading a file that fails with an OSError (permission denied)
_RETRY_S = 0.25  # ... the n-th retry waits n * _RETRY_S seconds
_RETRY = object()  # _read's answer: not read now, try again later
_GONE = object()  # _read's answer: the file vanished; read it if it reappears
_SKIP = object()  # _read's answer: not a regular file (now a symlink): skipped, not consumed
_STOP = object()  # _read's answer: the idle hook said stop while parsing; not consumed
_SYMLINK = "a symbolic link (not followed: only regular files are read; skipped)"
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def _open_no_follow(path: str, flags: int) -> int:
    """``open``'s opener: fails with ``ELOOP`` on a link, never blocks on a FIFO."""
    return os.open(path, flags | _NO_FOLLOW)


class _OpenFile:
    """One file being consumed: its valid rows and the read pointer over them."""

    __slots__ = ("name", "cols", "index", "n_total", "k")

    def __init__(self, name: str, cols: Columns, index: np.ndarray, n_total: int, k: int) -> None:
        self.name = name
        self.cols = cols
        self.index = index  # row number (in the file) of each valid row
        self.n_total = n_total
        self.k = k  # valid rows consumed

    @property
    def remaining(self) -> int:
        return len(self.index) - self.k

    @property
    def position(self) -> int:
        """Rows of the file consumed (valid or dead-lettered) once ``k`` valid rows are taken."""
        return int(self.index[self.k]) if self.k < len(self.index) else self.n_total


class DirectorySource(StreamSource):
    """Tail a folder of JSON-lines / ``.npz`` / ``.pt`` files, in name order, as batches.

    Records are batched across file boundaries (``batch_size`` records per batch). The cursor
    (:meth:`state_dict`) is ``{"done": files fully consumed, "partial": {file: rows consumed}}``
    as of the last batch yielded; restore it with :meth:`load_state_dict` to continue exactly
    there. Consumed files that disappear from the folder are dropped from the cursor, so its
    size follows the folder's.

    Sharding: file ``f`` belongs to shard ``crc32(f) % (world_size * num_workers)``; this
    reader takes shard ``rank * num_workers + worker_id`` (see :func:`resolve_shard`).

    Malformed records (bad JSON, missing or ill-typed fields, a label other than 0/1, a
    non-finite dense value) and unreadable files go to the dead-letter file with
    ``{"file", "row"}`` positions (``"row": null`` for a whole file), and are skipped.
    Only regular files are read: a symbolic link (even one to a good file), a FIFO, a socket
    or a folder with a readable name is dead-lettered once by name (never its target's
    content) and skipped; a file swapped for a link between the listing and the read is
    not followed either (``O_NOFOLLOW``).

    Args:
        directory: the folder to tail (it may not exist yet).
        batch_size: records per batch.
        schema: the record schema (default :class:`ClickSchema`).
        suffixes: the file formats read, among ``"jsonl"``, ``"npz"``, ``"pt"``.
        poll_interval: seconds between two listings while there is nothing to read; also
            the most time between two stop checks (the idle hook) while a JSON-lines file
            is parsed (4096 lines at a time; a stop leaves the file unconsumed).
        max_idle_s: end the stream after this many seconds without a new file (None: never).
        end_marker: a file name; once it exists and all files are consumed, the stream ends.
        linger_s: while waiting, yield a partial batch once its first record has waited this
            long (None: only full batches, except the last one at the end of the stream).
        drop_last: drop the final partial batch at the end of the stream (its records stay
            unconsumed in the cursor).
        dead_letter_path: default ``{directory}/_dead_letter.jsonl``.
        rank, world_size: shard explicitly (default: from ``torch.distributed``).
        delete_consumed: delete a file once a durable checkpoint of ``RecModel.online_train``
            counts it as consumed, so an endless stream does not fill the disk. The
            checkpoint is the one *before* the newest (the newest too at the end of a run):
            if the newest is unreadable, the resume falls back to one whose files are all
            still there. Without ``ckpt_dir`` nothing is deleted. Deleted files leave the
            cursor. ``files_deleted`` counts them. The files are unlinked by a background
            thread (:mod:`~lit_amp.rec.sources.deleter`), so the training loop does not wait
            for the disk; a name that now holds another file than the one read is kept.
        max_shard_bytes: the most bytes an ``.npz`` shard's arrays may declare (default
            256 MiB; None: no limit). The members' declared uncompressed sizes and ``.npy``
            headers are checked before anything is decompressed; a shard over the limit (a
            zip bomb: a few MB of deflated zeros declaring GBs) is dead-lettered whole, like
            a corrupt file. Only the arrays the schema reads (``schema.shard_arrays``, if it
            names them) are read or counted; other members are never decompressed.

    Raises:
        ValueError: bad sizes, intervals or suffixes.

    Example:
        >>> import tempfile
        >>> from lit_amp.rec.sources import SyntheticClickSource, write_shard
        >>> d = tempfile.mkdtemp()
        >>> gen = SyntheticClickSource(batch_size=5, seed=0)
        >>> for i in range(3):
        ...     _ = write_shard(d, f"part-{i:06d}", gen.columns(i), "jsonl")
        >>> src = DirectorySource(d, batch_size=4, max_idle_s=0.0)
        >>> [len(label) for _, label in src]
        [4, 4, 4, 3]
        >>> sorted(src.state_dict()["done"]), src.state_dict()["partial"]
        (['part-000000.jsonl', 'part-000001.jsonl', 'part-000002.jsonl'], {})
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        batch_size: int = 1000,
        *,
        schema: Any = None,
        suffixes: tuple[str, ...] = FORMATS,
        poll_interval: float = 0.05,
        max_idle_s: float | None = None,
        end_marker: str | None = "_END",
        linger_s: float | None = None,
        drop_last: bool = False,
        dead_letter_path: str | os.PathLike | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        delete_consumed: bool = False,
        max_shard_bytes: int | None = _MAX_SHARD_BYTES,
    ) -> None:
        directory = os.path.abspath(os.fspath(directory))
        super().__init__(
            dead_letter_path=dead_letter_path or os.path.join(directory, "_dead_letter.jsonl"),
            name="DirectorySource",
        )
        owner = "DirectorySource"
        check_source_args(
            owner,
            batch_size,
            (
                ("poll_interval", poll_interval, False),
                ("max_idle_s", max_idle_s, True),
                ("linger_s", linger_s, True),
            ),
        )
        if not isinstance(delete_consumed, bool):
            raise TypeError(
                f"For '{owner}', the argument 'delete_consumed' must be a bool, but got "
                f"{delete_consumed!r}."
            )
        if max_shard_bytes is not None and (
                not isinstance(max_shard_bytes, int) or isinstance(max_shard_bytes, bool)
                or max_shard_bytes <= 0):
            raise ValueError(
                f"For '{owner}', the argument 'max_shard_bytes' must be a positive int or "
                f"None, but got {max_shard_bytes!r}."
            )
        bad = [s for s in suffixes if s not in FORMATS]
        if not suffixes or bad:
            raise ValueError(
                f"For '{owner}', the argument 'suffixes' must be a non-empty subset of "
                f"{list(FORMATS)}, but got {suffixes!r}."
            )
        self.directory = directory
        self.batch_size = batch_size
        self.schema = schema if schema is not None else ClickSchema()
        self.suffixes = tuple("." + s for s in suffixes)
        self.poll_interval = float(poll_interval)
        self.max_idle_s = max_idle_s
        self.end_marker = end_marker
        self.linger_s = linger_s
        self.drop_last = bool(drop_last)
        self.rank, self.world_size = rank, world_size
        self.delete_consumed = delete_consumed
        self.max_shard_bytes = max_shard_bytes
        self._deleter = Deleter(directory, owner)
        self._cursor = {"done": frozenset(), "partial": {}}
        self._missing_logged = False
        self._special: set[str] = set()  # non-regular files, dead-lettered once
        self._failures: dict[str, int] = {}  # unreadable files: failed attempts
        self._retry_at: dict[str, float] = {}  # ... and when to try again
        self._sigs: dict[str, tuple[int, int, int]] = {}  # files read: (inode, size, mtime)
        self._sigs_view: dict[str, list[int]] | None = None  # state_dict's snapshot of _sigs
        self._dir_mtime: int | None = None

    # ------------------------------------------------------------------ cursor
    def state_dict(self) -> dict[str, Any]:
        """``{"done": consumed file names, "partial": {name: rows consumed}, "sigs": ...}``.

        ``sigs`` holds each read file's identity ``(inode, size, mtime_ns)``, so after a
        restart a consumed name that now holds another file is read again. Cheap (the consumed
        set and the identities are shared snapshots, not copied per call): RecModel reads it
        after every batch.
        """
        if self._sigs_view is None:
            self._sigs_view = dict(self._sigs)  # a C-level copy: rebuilt at every new file
        return {"done": self._cursor["done"], "partial": dict(self._cursor["partial"]),
                "sigs": self._sigs_view}

    def _restore(self, state: dict[str, Any]) -> None:
        done, partial = state.get("done", []), state.get("partial", {})
        if not isinstance(done, (list, tuple, set, frozenset)) or not isinstance(partial, dict):
            raise ValueError(
                "For 'DirectorySource.load_state_dict', the state must be {'done': [names], "
                f"'partial': {{name: rows}}}}, but got {state!r}."
            )
        self._cursor = {
            "done": frozenset(done),
            "partial": {str(k): int(v) for k, v in partial.items()},
        }
        sigs = state.get("sigs") or {}
        if isinstance(sigs, dict):
            for name, sig in sigs.items():
                if isinstance(name, str) and isinstance(sig, (list, tuple)) and len(sig) == 3:
                    self._sigs[name] = tuple(int(x) for x in sig)
            self._sigs_view = None
            self._dir_mtime = None  # compare the restored identities at the first scan

    def checkpointed(self, state: dict[str, Any]) -> None:
        """With ``delete_consumed``: delete the files that ``state`` counts as consumed.

        Only plain names this source would read are touched (a name with a path separator,
        a hidden name or another suffix is ignored); a file already gone is fine, and a file
        that cannot be deleted is logged, never raised. The files are unlinked in a
        background thread; :meth:`wait_cleanup` waits for it.
        """
        if not self.delete_consumed or not isinstance(state, dict):
            return
        self._deleter.submit(
            (name, self._sigs.get(name))
            for name in state.get("done", ())
            if isinstance(name, str) and name and os.sep not in name and "/" not in name
            and self._wanted(name)
        )

    def wait_cleanup(self, timeout: float | None = None) -> bool:
        """Wait for the consumed files being deleted; False if ``timeout`` s passed first."""
        return self._deleter.wait(timeout)

    @property
    def files_deleted(self) -> int:
        """Consumed files deleted so far."""
        return self._deleter.deleted

    @staticmethod
    def merge_state_dicts(states: list[dict[str, Any]]) -> dict[str, Any]:
        """One cursor from several readers' cursors (valid for any new sharding).

        Example:
            >>> DirectorySource.merge_state_dicts(
            ...     [{"done": ["a"], "partial": {"b": 3}}, {"done": ["c"], "partial": {}}])
            {'done': ['a', 'c'], 'partial': {'b': 3}}
        """
        done: set[str] = set()
        partial: dict[str, int] = {}
        sigs: dict[str, Any] = {}
        for s in states:
            done.update(s.get("done", []))
            for k, v in s.get("partial", {}).items():
                partial[k] = max(partial.get(k, 0), int(v))
            sigs.update(s.get("sigs") or {})
        merged: dict[str, Any] = {
            "done": sorted(done),
            "partial": {k: v for k, v in partial.items() if k not in done},
        }
        if sigs:
            merged["sigs"] = {k: v for k, v in sigs.items() if k in done}
        return merged

    # ------------------------------------------------------------------ files
    def _list(self) -> list[str] | None:
        try:
            with os.scandir(self.directory) as it:
                names = []
                for e in it:
                    if not self._wanted(e.name):
                        names.append(e.name)
                        continue
                    try:  # never follows a link: a loop (ELOOP) cannot raise here
                        link = e.is_symlink()
                        regular = not link and e.is_file(follow_symlinks=False)
                    except OSError:  # vanished or unreadable entry: seen at the next listing
                        continue
                    if regular:
                        names.append(e.name)
                        self._special.discard(e.name)  # e.g. a link replaced by a file
                    else:  # a symlink, FIFO, socket, folder: never opened
                        self._skip_special(e.name, _SYMLINK if link else None)
        except FileNotFoundError:
            if not self._missing_logged:
                log.info("DirectorySource: %s does not exist yet; waiting.", self.directory)
                self._missing_logged = True
            return None
        return names

    def _skip_special(self, name: str, why: str | None = None) -> None:
        """Dead-letter a name that is not a regular file, once (by name: never its content)."""
        self._failures.pop(name, None)  # a retried file now a link: no longer retried
        self._retry_at.pop(name, None)
        if name in self._special:
            return
        self._special.add(name)
        self.dead_letter.write({"file": name, "row": None},
                               why or "not a regular file (skipped)",
                               os.path.join(self.directory, name))

    def _wanted(self, name: str) -> bool:
        return name[0] not in "._" and name.endswith(self.suffixes)

    def _replaced(self, done: frozenset[str]) -> set[str]:
        """Consumed names now holding another file (inode, size or mtime changed).

        Checked only when the folder itself changed (a rename into it changes its mtime),
        and only for files this process read.
        """
        try:
            mtime = os.stat(self.directory).st_mtime_ns
        except OSError:
            return set()
        if mtime == self._dir_mtime or not self._sigs:
            return set()
        self._dir_mtime = mtime
        replaced = set()
        for name in list(self._sigs):
            try:
                st = os.lstat(os.path.join(self.directory, name))
            except OSError:
                del self._sigs[name]  # gone: forget it
                self._sigs_view = None
                continue
            if name in done and identity(st) != self._sigs[name]:
                replaced.add(name)
                del self._sigs[name]
                self._sigs_view = None
        return replaced

    def _read(self, name: str, start: int) -> Any:
        """Read and validate a whole file; dead-letter its bad rows (at or after ``start``)."""
        path = os.path.join(self.directory, name)
        try:
            try:  # O_NOFOLLOW: a file swapped for a link since the listing is not followed
                f = open(path, "rb", opener=_open_no_follow)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                self._skip_special(name, _SYMLINK)
                return _SKIP
            with f:
                fd = f.fileno()
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):  # a FIFO or folder swapped in since
                    self._skip_special(name)
                    return _SKIP
                self._sigs[name] = identity(st)
                self._sigs_view = None
                parsed = parse_shard(f, name, self.schema, self.max_shard_bytes,
                                     self.poll_interval, self._idle)
                if parsed is None:
                    return _STOP
                cols, index, bad, n_total = parsed
        except FileNotFoundError:  # not consumed: a file that reappears is read then
            log.warning("DirectorySource: %s vanished before it was read; it is read if it "
                        "reappears.", path)
            if self._sigs.pop(name, None) is not None:
                self._sigs_view = None
            return _GONE
        except OSError as exc:  # permission denied, I/O error: retried, then dead-lettered
            tries = self._failures.get(name, 0) + 1
            self._failures[name] = tries
            if tries < _READ_TRIES:
                log.warning("DirectorySource: cannot read %s (attempt %d of %d): %s; retrying.",
                            path, tries, _READ_TRIES, exc)
                self._retry_at[name] = time.monotonic() + _RETRY_S * tries
                return _RETRY
            self._retry_at.pop(name, None)
            self.dead_letter.write({"file": name, "row": None},
                                   f"unreadable file after {tries} attempts: {exc}", path)
            return None
        except Exception as exc:  # a corrupt file is dead-lettered, never a crash
            self.dead_letter.write({"file": name, "row": None}, f"unreadable file: {exc}", path)
            return None
        self._failures.pop(name, None)
        self._retry_at.pop(name, None)
        for row, why, raw in bad:
            if row >= start:
                self.dead_letter.write({"file": name, "row": int(row)}, why, raw)
        k = int(np.searchsorted(index, start)) if start else 0
        return _OpenFile(name, cols, index, n_total, k)

    # ------------------------------------------------------------------ iteration
    def _new_files(
        self, done: frozenset[str], skip: set, shard: int, nshards: int
    ) -> tuple[frozenset[str], list[str]]:
        """``(done, new)``: ``done`` less removed files, and this shard's unread files, sorted."""
        # taken before the listing: a name deleted during it may still be listed, and is not
        # a new file (taken after, it would be read again and found missing)
        gone = self._deleter.take_gone()
        names = self._list()
        if names is None:
            return done, []
        present = set(names)
        if not done <= present:
            done = done & present  # consumed files that were removed leave the cursor
        if gone:  # a name we deleted that is back is a new file (same name reused)
            done = done - (gone & present)
        done = done - self._replaced(done)
        now = time.monotonic()
        new = sorted(
            n
            for n in names
            if self._wanted(n)
            and n not in done
            and n not in skip
            and n not in self._special
            and self._retry_at.get(n, 0.0) <= now
            and (nshards == 1 or shard_of(n, nshards) == shard)
        )
        return done, new

    def _stream_end(self, idle_for: float, drained: Callable[[], bool]) -> str | None:
        """Why the stream ends now, or None while it goes on.

        ``drained()`` rescans the folder and tells whether nothing is left to read (files
        written before the end marker must be read first).
        """
        if self._retry_at:  # an unreadable file is still being retried
            return None
        if self.max_idle_s is not None and idle_for >= self.max_idle_s:
            return "idle_timeout"
        if self.end_marker and os.path.exists(os.path.join(self.directory, self.end_marker)):
            return "source_exhausted" if drained() else None
        return None

    def __iter__(self) -> Iterator[Any]:
        """Batches in file-name order; ``end_reason``: ``"source_exhausted"`` (the end marker,
        every file consumed), ``"idle_timeout"`` (``max_idle_s`` without a new file) or
        ``"stopped"`` (the idle hook)."""
        tail = _Tail(self, *resolve_shard(self.rank, self.world_size))
        self.end_reason = None
        while True:
            full = tail.fill()
            if tail.stopped:  # the idle hook said stop while a shard was parsed
                self.end_reason = "stopped"
                return
            if full:  # a full batch
                t_out = time.monotonic()
                yield tail.emit()
                tail.last_new += time.monotonic() - t_out  # training time is not idle time
                continue
            # nothing to read now
            now = time.monotonic()
            if tail.nbuf and self.linger_s is not None and now - tail.buf_since >= self.linger_s:
                yield tail.emit()
                continue
            reason = self._stream_end(now - tail.last_new, tail.drained)
            if reason is not None:
                self.end_reason = reason
                if tail.nbuf and not self.drop_last:
                    yield tail.emit()
                return
            if self._idle():
                self.end_reason = "stopped"
                return
            self._sleep(self.poll_interval)


class _Tail:
    """One pass of :meth:`DirectorySource.__iter__`: the scan position, the open file and the
    batch being built.

    ``done`` / ``partial`` are the cursor as the read pointer advances; the source's cursor
    becomes a copy of them only when a batch is emitted (so it always matches the last batch
    yielded). ``queue`` holds this shard's listed files not yet opened, in name order.
    """

    def __init__(self, source: DirectorySource, shard: int, nshards: int) -> None:
        self.source = source
        self.shard, self.nshards = shard, nshards
        self.done: frozenset[str] = source._cursor["done"]
        self.partial: dict[str, int] = dict(source._cursor["partial"])
        self.queue: deque[str] = deque()
        self.queued: set[str] = set()
        self.cur: _OpenFile | None = None
        self.parts: list[Columns] = []  # the batch being built
        self.nbuf = 0  # records in it
        self.buf_since = 0.0  # when its first record was taken
        self.last_new = time.monotonic()  # when a file was last opened (the idle clock)
        self.stopped = False  # the idle hook said stop while a file was parsed

    def scan(self) -> None:
        """List the folder: queue this shard's new files, drop removed ones from ``done``."""
        skip = self.queued | {self.cur.name if self.cur is not None else None}
        self.done, new = self.source._new_files(self.done, skip, self.shard, self.nshards)
        self.queue.extend(new)
        self.queued.update(new)

    def drained(self) -> bool:
        """Rescan; True when nothing is left to read (for the end marker)."""
        self.scan()
        return not self.queue

    def _consumed(self, name: str) -> None:
        self.done = self.done | {name}
        self.partial.pop(name, None)

    def open_next(self) -> None:
        """Open queued files (scanning first when the queue is empty) until one has rows."""
        if not self.queue:
            self.scan()
        while self.queue and self.cur is None:
            name = self.queue.popleft()
            self.queued.discard(name)
            self.last_new = time.monotonic()
            opened = self.source._read(name, self.partial.get(name, 0))
            if opened is _STOP:  # read again from the start by the next pass
                self.queue.appendleft(name)
                self.queued.add(name)
                self.stopped = True
                return
            if opened is _RETRY or opened is _GONE or opened is _SKIP:
                continue
            if opened is None or opened.remaining == 0:
                self._consumed(name)
            else:
                self.cur = opened

    def fill(self) -> bool:
        """Move rows of the open files into the batch; True once it is full, False when no
        file has rows left now."""
        bs = self.source.batch_size
        while True:
            if self.cur is None:
                self.open_next()
            cur = self.cur
            if cur is None:
                return False
            take = min(bs - self.nbuf, cur.remaining)
            if self.nbuf == 0:
                self.buf_since = time.monotonic()
            self.parts.append(self.source.schema.slice(cur.cols, cur.k, cur.k + take))
            self.nbuf += take
            cur.k += take
            if cur.remaining == 0:
                self._consumed(cur.name)
                self.cur = None
            else:
                self.partial[cur.name] = cur.position
            if self.nbuf == bs:
                return True

    def emit(self) -> Any:
        """The batch built so far; the source's cursor becomes this position."""
        src = self.source
        cols = src.schema.concat(self.parts)
        src._cursor = {"done": self.done, "partial": dict(self.partial)}
        self.parts, self.nbuf = [], 0
        src.records_read += len(cols["id"])
        src.batches_read += 1
        return src.schema.to_batch(cols)
