"""Persistence (Python, fcntl, numpy): atomic writes, one background writer, pruning.

:func:`atomic_write` writes a temp file of lit_amp's prefix (:data:`TMP_PREFIX`, locked while
written), fsyncs it and renames it over the target, so after a crash the target holds the old
or the new content; a full disk raises an ``OSError`` naming the file and the free space, and
:func:`remove_stale_temps` deletes only the temps of killed writers. With ``drop_cache`` a
checkpoint is written around the page cache (``O_DIRECT``) so it does not crowd out training.
:class:`BackgroundJobs` runs a writer's jobs in one thread (as Lightning's ``AsyncCheckpointIO``):
at most ``limit`` in flight, a failed job's error raised at the next submit, wait or close.
:func:`prune_newest` keeps the newest N files (or folders) of a name pattern.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import re
import shutil
import tempfile
from collections import deque
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any

import numpy as np

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, the pattern alone decides
    fcntl = None

__all__ = ["TMP_PREFIX", "BackgroundJobs", "atomic_write", "prune_newest", "remove_stale_temps",
           "temp_target"]

log = logging.getLogger(__name__)

#: prefix of every temp file lit_amp writes; :func:`remove_stale_temps` removes only these
TMP_PREFIX = ".tmp-lit_amp-"
#: the most characters of the target's name a temp file's name keeps (NAME_MAX is 255)
_TMP_NAME_KEEP = 200

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


def _drop_cache(fd: int) -> None:
    """Evict ``fd``'s clean (written back) pages from the page cache."""
    fadvise = getattr(os, "posix_fadvise", None)
    if fadvise is not None:
        try:
            fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:  # pragma: no cover - a filesystem without the advice
            pass


class _DirectFile:
    """A write-only file over ``fd`` whose bytes skip the page cache (``O_DIRECT``).

    Direct writes must start and end on a block boundary from a block-aligned address: the
    bytes are gathered in a page-aligned buffer (copied by numpy, which releases the GIL) and
    written in whole blocks. :meth:`flush` writes the last partial block through the page
    cache (``O_DIRECT`` cleared), as it does everything after a :meth:`seek` and everything
    when the filesystem refuses a direct write (``EINVAL``).
    """

    BLOCK = 4096  # a multiple of every logical block size in use (512, 4096)
    STAGE = 8 << 20

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = mmap.mmap(-1, self.STAGE)  # page-aligned
        self._stage = np.frombuffer(self._buffer, dtype=np.uint8)
        self._n = 0  # bytes staged
        self._pos = 0  # the file position the caller sees
        self.direct = True
        self.direct_bytes = 0  # written around the page cache

    @classmethod
    def open(cls, fd: int) -> _DirectFile | None:
        """``fd`` (at offset 0) switched to direct writes; None where it cannot be."""
        if fcntl is None or not hasattr(os, "O_DIRECT"):
            return None
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
        except OSError:  # e.g. tmpfs
            return None
        return cls(fd)

    def _buffered(self) -> None:
        if self.direct:
            self.direct = False
            fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)

    def _write_all(self, view: memoryview) -> None:
        done = 0
        while done < len(view):
            try:
                k = os.write(self.fd, view[done:])
                done += k
                self.direct_bytes += k if self.direct else 0
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                self._buffered()  # the filesystem or the device refuses this direct write

    def _drain(self) -> None:
        """Write the staged bytes: the whole blocks directly, the rest through the cache."""
        full = self._n - self._n % self.BLOCK
        self._write_all(memoryview(self._buffer)[:full])
        if full < self._n:
            self._buffered()
            self._write_all(memoryview(self._buffer)[full:self._n])
        self._n = 0

    def write(self, b: Any) -> int:
        src = np.frombuffer(memoryview(b).cast("B"), dtype=np.uint8)
        if not self.direct:
            self._write_all(memoryview(src))
            self._pos += len(src)
            return len(src)
        at = 0
        while at < len(src):
            k = min(self.STAGE - self._n, len(src) - at)
            np.copyto(self._stage[self._n:self._n + k], src[at:at + k])
            self._n += k
            at += k
            if self._n == self.STAGE:  # a multiple of BLOCK: all of it goes direct
                self._drain()
        self._pos += len(src)
        return len(src)

    def flush(self) -> None:
        if self._n:
            self._drain()
        self._buffered()

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.flush()
        self._pos = os.lseek(self.fd, offset, whence)
        return self._pos

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def __enter__(self) -> _DirectFile:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self.flush()
        finally:
            os.close(self.fd)
            # unmapped once unreferenced (a traceback may still hold a view of it)
            self._stage = self._buffer = None


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
                 fsync: bool = True, drop_cache: bool = False) -> str:
    """Write ``path`` atomically: ``write(f)`` fills a temp file that replaces ``path``.

    Args:
        path: the target file; its folder is created if missing.
        write: called once with a binary file object open for writing.
        fsync: flush file and folder to stable storage before returning (the default;
            a checkpoint that only sits in the page cache is lost by a power cut).
        drop_cache: with ``fsync``, keep the file out of the page cache: write it around it
            (``O_DIRECT``) where the filesystem allows, and evict what is cached of it once it
            is on disk (``posix_fadvise(DONTNEED)``; where the platform has neither, only the
            memory differs).

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
            direct = _DirectFile.open(fd) if fsync and drop_cache else None
            with direct if direct is not None else os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
                    if drop_cache:
                        _drop_cache(f.fileno())
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


class BackgroundJobs:
    """Runs jobs in one worker thread, in the order submitted, at most ``limit`` in flight.

    A job's error is held: :meth:`submit`, :meth:`wait` and :meth:`close` raise it (the
    oldest first), unless the caller took the job (:meth:`take`) to handle its outcome itself.
    The thread starts at the first submit and stops at :meth:`close` (a later submit starts
    another).

    Args:
        name: the worker thread's name prefix.
        limit: jobs in flight at most; a submit beyond it first waits for the oldest (and
            raises its error). None: any number (queued).

    Example:
        >>> jobs = BackgroundJobs("example")
        >>> jobs.submit(sum, [1, 2]).result()
        3
        >>> jobs.submit(int, "x"); jobs.close()
        Traceback (most recent call last):
        ...
        ValueError: invalid literal for int() with base 10: 'x'
    """

    def __init__(self, name: str, *, limit: int | None = 1) -> None:
        self.name = name
        self.limit = limit
        self._pool: ThreadPoolExecutor | None = None
        self._jobs: deque[tuple[Future, Any]] = deque()  # (future, note), oldest first

    def submit(self, fn: Callable[..., Any], /, *args: Any, note: Any = None,
               **kwargs: Any) -> Future:
        """Run ``fn(*args, **kwargs)`` in the worker; ``note`` travels with it to :meth:`take`.

        Raises:
            BaseException: a finished job's error (then nothing is submitted).
        """
        self._raise_done()
        while self.limit is not None and len(self._jobs) >= self.limit:
            self._collect(self._jobs.popleft()[0])
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=self.name)
        future = self._pool.submit(fn, *args, **kwargs)
        self._jobs.append((future, note))
        return future

    def busy(self) -> bool:
        """Whether a job is still running or queued."""
        return any(not f.done() for f, _ in self._jobs)

    @property
    def pending(self) -> tuple[Future, Any] | None:
        """The oldest job not taken, ``(future, note)``, or None."""
        return self._jobs[0] if self._jobs else None

    def take(self, wait: bool = False) -> tuple[Future, Any] | None:
        """Hand over the oldest job once it is done (or ``wait`` for it): ``(future, note)``,
        its error no longer held; None when there is none (or it is still running)."""
        if not self._jobs or not (wait or self._jobs[0][0].done()):
            return None
        future, note = self._jobs.popleft()
        futures.wait([future])
        return future, note

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for every job; False if ``timeout`` seconds passed first.

        Raises:
            BaseException: a failed job's error (the oldest).
        """
        if futures.wait([f for f, _ in self._jobs], timeout).not_done:
            return False
        while self._jobs:
            self._collect(self._jobs.popleft()[0])
        return True

    def close(self) -> None:
        """Wait for every job and stop the worker; then raise a failed job's error."""
        try:
            self.wait()
        finally:
            pool, self._pool = self._pool, None
            if pool is not None:
                pool.shutdown(wait=True)
            self._jobs.clear()

    def _raise_done(self) -> None:
        while self._jobs and self._jobs[0][0].done():
            self._collect(self._jobs.popleft()[0])

    @staticmethod
    def _collect(future: Future) -> None:
        error = future.exception()
        if error is not None:
            raise error


def prune_newest(directory: str | os.PathLike,
                 pattern: str | re.Pattern | Callable[[str], Any], keep: int, *,
                 key: Callable[[str], Any] | None = None,
                 needs_previous: Callable[[str], bool] | None = None,
                 also: Callable[[str], list[str]] | None = None) -> list[str]:
    r"""Delete all but the newest ``keep`` entries (files or folders) of ``directory`` whose
    names match ``pattern``.

    Args:
        directory: the folder (a missing one has nothing to prune).
        pattern: a regular expression the whole name must match, or a predicate of the name.
        keep: how many to keep (0 deletes every match).
        key: orders the names, oldest first (default: the name).
        needs_previous: whether a kept entry needs the one before it (a link of a chain):
            the oldest kept entry is moved back until it does not.
        also: more names of ``directory`` to delete with an entry (e.g. a sidecar file; a
            missing one is no error).

    Returns:
        The names kept, oldest first. An entry that cannot be deleted is logged, not raised.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> for n in ("a-1", "a-2", "a-3", "b"): open(os.path.join(d, n), "w").close()
        >>> prune_newest(d, r"a-\d+", keep=2), sorted(os.listdir(d))
        (['a-2', 'a-3'], ['a-2', 'a-3', 'b'])
    """
    directory = os.fspath(directory)
    match = pattern if callable(pattern) else re.compile(pattern).fullmatch
    try:
        names = sorted((n for n in os.listdir(directory) if match(n)), key=key)
    except FileNotFoundError:
        return []
    first = max(0, len(names) - max(0, keep))
    while needs_previous is not None and 0 < first < len(names) and \
            needs_previous(names[first]):
        first -= 1
    for name in names[:first]:
        _remove_entry(os.path.join(directory, name))
        for other in also(name) if also is not None else ():
            _remove_entry(os.path.join(directory, other), quiet=True)
    return names[first:]


def _remove_entry(path: str, *, quiet: bool = False) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    except OSError as exc:
        if not quiet:
            log.warning("Could not remove the old %s: %s", path, exc)
