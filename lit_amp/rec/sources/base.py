"""The stream-source protocol (:class:`StreamSource`) and the pieces every source shares.

A stream source is an iterable of ready-made batches with a checkpointable cursor, an idle hook,
a declared end reason and a dead-letter file for malformed records; the class docstring states
the contract that ``tests/rec/sources/contract.py`` checks for every source.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal, get_args

import torch
from torch.utils.data import IterableDataset, get_worker_info

from lit_amp._runtime import dist_ready

__all__ = ["StreamSource", "EndReason", "END_REASONS", "DeadLetterFile", "resolve_shard"]

log = logging.getLogger(__name__)

_RAW_MAX = 4096  # characters of a malformed record kept in the dead-letter file
_ERROR_MAX = 512  # characters of the reason kept
_LINE_MAX = 16384  # bytes of one dead-letter line (JSON escapes can grow the record 6x)

#: Why a pass of :meth:`StreamSource.__iter__` ended (see :attr:`StreamSource.end_reason`).
EndReason = Literal[
    "source_exhausted", "idle_timeout", "stopped", "connection_reset", "connection_error"
]
#: Every :data:`EndReason`, in that order.
END_REASONS: tuple[str, ...] = get_args(EndReason)


def resolve_shard(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """This reader's shard: ``(shard_id, num_shards)`` over distributed ranks x DataLoader workers.

    ``rank``/``world_size`` default to ``torch.distributed``'s when a process group is
    initialized (else 0 / 1); inside a DataLoader worker each worker takes its own sub-shard.

    Example:
        >>> resolve_shard(1, 2)
        (1, 2)
    """
    if rank is None or world_size is None:
        dist = torch.distributed
        if dist_ready():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        rank = 0 if rank is None else rank
        world_size = 1 if world_size is None else world_size
    info = get_worker_info()
    if info is None:
        return rank, world_size
    return rank * info.num_workers + info.id, world_size * info.num_workers


def check_source_args(
    owner: str, batch_size: Any, seconds: tuple[tuple[str, Any, bool], ...]
) -> None:
    """The argument checks every source shares: a positive int batch size and durations.

    Args:
        owner: the class name, for the message.
        batch_size: must be a positive int.
        seconds: ``(name, value, allow_none)`` triples; each value a number >= 0 (or None).

    Raises:
        ValueError: naming the argument, the value and what is allowed.
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise ValueError(
            f"For '{owner}', the argument 'batch_size' must be a positive int, but got "
            f"{batch_size!r}."
        )
    for name, v, allow_none in seconds:
        if v is None and allow_none:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ValueError(
                f"For '{owner}', the argument '{name}' must be a number of seconds >= 0"
                f"{' or None' if allow_none else ''}, but got {v!r}."
            )


class DeadLetterFile:
    """Append-only JSON-lines file of malformed records, with their position in the stream.

    Each line: ``{"time", "source", "position", "error", "record"}`` (``record`` is the raw
    text, truncated to 4096 characters, ``error`` to 512): one entry stays under ~16 KiB
    however large the garbage. With ``path=None`` records are only logged (at
    WARNING, with position and content). Writes are flushed line by line, so a crash loses
    none; after a restart the same record may be dead-lettered again (at-least-once).

    Args:
        path: the file, or None.
        source: a name for the ``"source"`` field.

    Example:
        >>> import tempfile, os
        >>> dl = DeadLetterFile(os.path.join(tempfile.mkdtemp(), "dead.jsonl"), "demo")
        >>> dl.write({"line": 3}, "bad json", "{oops")
        >>> dl.count
        1
    """

    def __init__(self, path: str | os.PathLike | None, source: str) -> None:
        self.path = None if path is None else os.fspath(path)
        self.source = source
        self.count = 0
        self.unwritable = False  # a write to ``path`` failed: records go to the log
        self._lock = threading.Lock()

    def write(self, position: dict[str, Any], error: str, record: Any) -> None:
        """Record one malformed record; never raises.

        If the file cannot be written (a read-only folder, a full disk, a path under a
        file), the record is logged at WARNING with its content instead, still counted, and
        one WARNING names the path and the error; later records try the file again.
        """
        raw = record if isinstance(record, str) else _to_text(record)
        if len(raw) > _RAW_MAX:
            raw = raw[:_RAW_MAX] + "...(truncated)"
        if len(error) > _ERROR_MAX:
            error = error[:_ERROR_MAX] + "...(truncated)"
        with self._lock:
            self.count += 1
            n = self.count
        if self.path is None:  # no file: every record goes to the log, with its content
            self._log_record(position, error, raw)
            return
        entry = {"time": time.time(), "source": self.source, "position": position,
                 "error": error, "record": raw}
        line = json.dumps(entry)
        if len(line) > _LINE_MAX:  # control characters escaped 6x: keep the entry bounded
            entry["record"] = raw[: _RAW_MAX // 8] + "...(truncated)"
            line = json.dumps(entry)
        try:
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
            # one write() of one line with O_APPEND: lines of concurrent writers do not
            # interleave
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
        except OSError as exc:  # read-only mount, full disk...: the log, never a crash
            with self._lock:
                first = not self.unwritable
                self.unwritable = True
            if first:
                log.warning(
                    "%s: cannot write the dead-letter file %s (%s); malformed records go to "
                    "the log instead.", self.source, self.path, exc,
                )
            self._log_record(position, error, raw)
            return
        if n <= 10 or n % 1000 == 0:
            log.warning(
                "%s: malformed record #%d at %s: %s (dead-lettered to %s)",
                self.source,
                n,
                position,
                error,
                self.path,
            )

    def _log_record(self, position: dict[str, Any], error: str, raw: str) -> None:
        log.warning("%s: malformed record at %s: %s; record: %r", self.source, position, error, raw)


def _to_text(record: Any) -> str:
    if isinstance(record, bytes):
        return record.decode("utf-8", errors="replace")
    try:
        return json.dumps(record, default=repr)
    except (TypeError, ValueError):
        return repr(record)


class StreamSource(IterableDataset):
    """Base class of the stream sources: batches, a cursor, an idle hook, a dead-letter file.

    ``__iter__`` yields ready-made batches (no collation: wrap the source in
    ``DataLoader(source, batch_size=None)`` if you want a DataLoader). ``RecModel.online_train``
    relies on exactly what this class declares, and ``tests/rec/sources/contract.py`` checks it
    for every source:

    - **Cursor.** :meth:`state_dict` is the position *after the last batch yielded* (the
      generator is suspended right after a ``yield``, so the cursor read then matches that
      batch); a new source given it by :meth:`load_state_dict` continues exactly there:
      nothing repeated, nothing skipped. RecModel reads it after every batch and commits it
      once that batch is trained (at-least-once delivery).
    - **End of a pass.** Iteration ends by returning (never by raising) and sets
      :attr:`end_reason`; a pass after the data ended yields nothing and ends the same way.
    - **Idle timeout.** A source that waits for data ends a pass with ``"idle_timeout"``
      after :attr:`max_idle_s` seconds spent waiting (neither the time the consumer holds a
      yielded batch nor the source's own parsing counts); while it waits it calls the
      :meth:`bind_idle` hook at least every poll interval, and a true result ends the pass
      with ``"stopped"``.
    - **Bad rows.** A record that is not valid is never yielded and never raised: it goes to
      :attr:`dead_letter` with its position and reason and is counted in :attr:`malformed`.
      Every record goes through :meth:`_parse_record` (or a schema method that agrees with
      it), so whatever the parser raises sets that record alone aside.

    A subclass implements ``__iter__`` (keeping ``self._cursor`` equal to the position after
    the last batch yielded and setting :attr:`end_reason` when a pass ends) and
    ``_restore(state)`` (validate and adopt a cursor).

    Attributes:
        end_reason: why the last pass ended (:data:`EndReason`), None before a pass ends.
        max_idle_s: seconds of waiting for data that end a pass (None: never).
        dead_letter: the :class:`DeadLetterFile` malformed records go to.
        records_read: valid records yielded by this object.
        batches_read: batches yielded by this object.

    Args:
        dead_letter_path: where malformed records go (None: logged only).
        name: the source name used in logs and dead-letter lines.

    Example:
        >>> class Countdown(StreamSource):
        ...     def __init__(self, n):
        ...         super().__init__(name="Countdown")
        ...         self._cursor = {"left": n}
        ...     def __iter__(self):
        ...         self.end_reason = None
        ...         while self._cursor["left"] > 0:
        ...             self._cursor = {"left": self._cursor["left"] - 1}
        ...             yield (torch.zeros(2, 3), torch.ones(2))
        ...         self.end_reason = "source_exhausted"
        >>> src = Countdown(3)
        >>> it = iter(src); _ = next(it); src.state_dict(), src.end_reason
        ({'left': 2}, None)
        >>> _ = list(it); src.end_reason
        'source_exhausted'
    """

    #: Why the last pass of ``__iter__`` ended: ``"source_exhausted"`` (the data ended: an end
    #: marker, a clean close, ``num_records``), ``"idle_timeout"`` (:attr:`max_idle_s` spent
    #: waiting for data), ``"stopped"`` (the idle hook asked to stop), ``"connection_reset"`` /
    #: ``"connection_error"`` (the connection broke: restart to resume). None while a pass
    #: runs or before the first; ``RecModel.online_train`` reports it as ``stop_reason``.
    end_reason: EndReason | None = None
    #: Seconds spent waiting for data after which a pass ends with ``"idle_timeout"``; the
    #: time the consumer holds a yielded batch does not count. None: the source never ends for
    #: idleness (it waits, calling the idle hook, until the data ends or the hook says stop).
    max_idle_s: float | None = None
    dead_letter: DeadLetterFile
    records_read: int
    batches_read: int

    def __init__(self, *, dead_letter_path: str | os.PathLike | None = None, name: str) -> None:
        super().__init__()
        self.end_reason = None
        self.dead_letter = DeadLetterFile(dead_letter_path, name)
        self._idle_fn: Callable[[], bool] | None = None
        self._cursor: dict[str, Any] = {}
        self.records_read = 0
        self.batches_read = 0

    # ------------------------------------------------------------------ protocol
    @property
    def malformed(self) -> int:
        """Malformed records met so far (each one is in the dead-letter file / the log)."""
        return self.dead_letter.count

    def state_dict(self) -> dict[str, Any]:
        """The cursor after the last batch yielded (a small, picklable dict)."""
        return dict(self._cursor)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the next ``iter()`` from a cursor returned by :meth:`state_dict`.

        Raises:
            TypeError: ``state`` is not a dict.
        """
        if not isinstance(state, dict):
            raise TypeError(
                f"For '{type(self).__name__}.load_state_dict', the argument 'state' must be a "
                f"dict returned by state_dict(), but got {type(state).__name__}."
            )
        self._restore(state)

    def _restore(self, state: dict[str, Any]) -> None:
        self._cursor = dict(state)

    def checkpointed(self, state: dict[str, Any]) -> None:
        """``RecModel.online_train`` calls it once a checkpoint holding ``state`` (this
        reader's cursor) is durable: the records before that cursor will never be read again.

        It is called in the training loop, so it must return quickly: slow clean-up goes to a
        background thread that :meth:`wait_cleanup` waits for. The default does nothing;
        :class:`DirectorySource` (``delete_consumed=True``) deletes the files the cursor
        counts as consumed.
        """

    def wait_cleanup(self, timeout: float | None = None) -> bool:
        """Wait for the clean-up :meth:`checkpointed` started; False if ``timeout`` s passed
        first. ``RecModel.online_train`` calls it at the end of a run. The default has none
        to wait for.
        """
        return True

    def bind_idle(self, fn: Callable[[], bool] | None) -> None:
        """Call ``fn()`` at every poll while waiting for data; a true result ends iteration."""
        self._idle_fn = fn

    def _idle(self) -> bool:
        return bool(self._idle_fn()) if self._idle_fn is not None else False

    def _parse_record(self, schema: Any, raw: Any, position: dict[str, Any]) -> Any:
        """``schema.parse_json(raw)``, or None after dead-lettering ``raw`` at ``position``.

        The one malformed-record path of the sources: any exception the parser raises (the
        built-in schema raises ``ValueError`` for every bad record; a custom schema may raise
        anything) sets the record aside with its reason; it is never raised.
        """
        try:
            return schema.parse_json(raw)
        except Exception as exc:  # noqa: BLE001 - a bad record is never a crash
            why = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            self.dead_letter.write(position, why, raw)
            return None

    def __iter__(self) -> Iterator[Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)
