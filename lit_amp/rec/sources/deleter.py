"""Deleting a source's consumed files in a background thread.

``DirectorySource(delete_consumed=True)`` is told in the training loop that a checkpoint is
durable; unlinking the hundreds of files it covers there, while a multi-GB checkpoint is being
written back, blocked the loop for 0.1-0.3 s per checkpoint. A :class:`Deleter` takes the
list and returns at once; one thread unlinks them (:meth:`Deleter.wait` waits for it).

A file is deleted only if it is still the file that was read: a name given with its identity
``(inode, size, mtime_ns)`` that now holds another file (a producer reused the name) is left
for the reader.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Iterable, Sequence

from lit_amp._io import BackgroundJobs

__all__ = ["Deleter"]

log = logging.getLogger(__name__)

Identity = Sequence[int]  # (st_ino, st_size, st_mtime_ns)


def identity(st: os.stat_result) -> tuple[int, int, int]:
    """A file's identity as the readers record it."""
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class Deleter:
    """Unlinks files of ``directory`` in one thread, in the order they are submitted.

    Args:
        directory: the folder the names are in.
        owner: the name used in log lines.

    Attributes:
        deleted: files unlinked so far.
        failed: files that could not be unlinked (logged once per batch; never raised).

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); (d / "a.npz").write_text("x")
        1
        >>> deleter = Deleter(d, "example")
        >>> deleter.submit([("a.npz", None)]); deleter.wait(10), deleter.deleted
        (True, 1)
    """

    def __init__(self, directory: str | os.PathLike, owner: str) -> None:
        self.directory = os.fspath(directory)
        self.owner = owner
        self.deleted = 0
        self.failed = 0
        self._gone: deque[str] = deque()  # names unlinked, not yet taken by the reader
        # one thread: batches run in order, queued (submit never waits)
        self._jobs = BackgroundJobs(f"lit_amp-{owner}-delete", limit=None)

    def submit(self, names: Iterable[tuple[str, Identity | None]]) -> None:
        """Queue ``(name, identity or None)`` pairs for deletion; returns at once."""
        batch = list(names)
        if not batch:
            return
        self._jobs.submit(self._delete, batch)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every submitted file is handled; False if ``timeout`` s passed first."""
        return self._jobs.wait(timeout)

    def take_gone(self) -> set[str]:
        """The names unlinked since the last call (the reader's listing uses them)."""
        out = set()
        while self._gone:
            out.add(self._gone.popleft())
        return out

    def _delete(self, batch: list[tuple[str, Identity | None]]) -> None:
        failed = 0
        for name, ident in batch:
            path = os.path.join(self.directory, name)
            try:
                if ident is not None and identity(os.stat(path)) != tuple(ident):
                    continue  # another file under this name now: it is not consumed
                os.remove(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                failed += 1
                if failed == 1:
                    log.warning("%s: could not delete consumed %s: %s", self.owner, name, exc)
                continue
            self.deleted += 1
            self._gone.append(name)
        self.failed += failed
