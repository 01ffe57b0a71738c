"""``SocketSource``: newline-delimited JSON records over a TCP connection."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

from lit_amp._validation import check_int
from lit_amp.rec.sources.base import StreamSource, check_source_args
from lit_amp.rec.sources.schema import ClickSchema

__all__ = ["SocketSource"]

log = logging.getLogger(__name__)


class SocketSource(StreamSource):
    """Read newline-delimited JSON records from a TCP server, as batches.

    The source connects to ``host:port``. With ``handshake=True`` it first sends one line,
    ``{"resume_from": N}``, where ``N`` is the number of records consumed so far (the cursor):
    a producer that keeps its log can replay from there, which gives at-least-once delivery
    across restarts; a producer that ignores the line gives at-most-once (a socket itself
    cannot replay). The stream ends when the server closes the connection, or after
    ``max_idle_s`` spent *waiting* for data (neither parsing lines nor the consumer's training
    on a batch counts); ``end_reason`` says which: ``"source_exhausted"`` (a clean close),
    ``"connection_reset"`` / ``"connection_error"`` (the connection broke: restart to
    resume), ``"idle_timeout"`` or ``"stopped"`` (the idle hook asked to stop).
    Malformed lines go to the dead-letter file (or the log) with ``{"offset": N}``, their
    record number in the stream; so does the first 4096 bytes of a line longer than
    ``max_line_bytes`` (the rest of it is dropped as it arrives, so memory stays bounded by
    about ``max_line_bytes`` + 64 KiB whatever the peer sends).

    For several ranks, give each rank its own server or port (a socket is not sharded).

    Args:
        host, port: the server.
        batch_size: records per batch.
        schema: the record schema (default :class:`ClickSchema`).
        connect_timeout: seconds to keep retrying the connection.
        poll_interval: seconds between two checks of the idle hook while no data arrives.
        max_idle_s: end the stream after this long without data (None: wait forever).
        linger_s: while waiting, yield a partial batch once its first record waited this long.
        handshake: send the ``resume_from`` line after connecting.
        dead_letter_path: where malformed records go (None: the log).
        max_line_bytes: the longest line accepted (default 1 MiB).

    Raises:
        ValueError: bad port, sizes or intervals.
        ConnectionError: (when iterating) the server cannot be reached in ``connect_timeout``.

    Example:
        >>> src = SocketSource("127.0.0.1", 9999, batch_size=100)
        >>> src.state_dict()
        {'offset': 0}
    """

    def __init__(
        self,
        host: str,
        port: int,
        batch_size: int = 1000,
        *,
        schema: Any = None,
        connect_timeout: float = 10.0,
        poll_interval: float = 0.05,
        max_idle_s: float | None = None,
        linger_s: float | None = None,
        handshake: bool = True,
        dead_letter_path: str | os.PathLike | None = None,
        max_line_bytes: int = 1 << 20,
    ) -> None:
        super().__init__(dead_letter_path=dead_letter_path, name="SocketSource")
        owner = "SocketSource"
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ValueError(
                f"For '{owner}', the argument 'port' must be an int in [1, 65535], but got "
                f"{port!r}."
            )
        check_source_args(
            owner,
            batch_size,
            (
                ("connect_timeout", connect_timeout, False),
                ("poll_interval", poll_interval, False),
                ("max_idle_s", max_idle_s, True),
                ("linger_s", linger_s, True),
            ),
        )
        self.host, self.port = host, port
        self.batch_size = batch_size
        self.schema = schema if schema is not None else ClickSchema()
        self.connect_timeout = float(connect_timeout)
        self.poll_interval = max(float(poll_interval), 1e-3)
        self.max_idle_s = max_idle_s
        self.linger_s = linger_s
        self.handshake = bool(handshake)
        self.max_line_bytes = check_int(owner, "max_line_bytes", max_line_bytes, minimum=1)
        self._cursor = {"offset": 0}

    def _restore(self, state: dict[str, Any]) -> None:
        offset = state.get("offset")
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(
                "For 'SocketSource.load_state_dict', 'offset' must be an int >= 0, but got "
                f"{offset!r}."
            )
        self._cursor = {"offset": offset}

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self.connect_timeout
        while True:
            try:
                return socket.create_connection((self.host, self.port), timeout=1.0)
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise ConnectionError(
                        f"SocketSource: cannot connect to {self.host}:{self.port} within "
                        f"{self.connect_timeout} s: {exc}"
                    ) from exc
                time.sleep(0.05)

    def __iter__(self) -> Iterator[Any]:
        offset = int(self._cursor["offset"])
        self.end_reason = None
        sock = self._connect()
        try:
            sock.settimeout(self.poll_interval)
            if self.handshake:
                sock.sendall((json.dumps({"resume_from": offset}) + "\n").encode())
            yield from self._read_lines(sock, offset)
        finally:
            sock.close()

    def _read_lines(self, sock: socket.socket, offset: int) -> Iterator[Any]:
        """Lines -> batches. Buffering is linear (one bytearray, scanned once, compacted
        once per pass) and bounded by ``max_line_bytes``; the idle hook (stop signals) runs at
        least every ``poll_interval`` even while bytes keep coming; the idle clock runs only
        while waiting for data (not while the consumer trains on a yielded batch)."""
        lines = _Lines(self.max_line_bytes)
        rows: list[tuple] = []
        first_at = 0.0
        last_hook = time.monotonic()
        waited = 0.0  # seconds of recv timeouts since the last bytes: the idle clock
        eof = False
        while True:
            while len(rows) < self.batch_size:  # complete lines in hand -> records
                line = lines.pop()
                if line is None:
                    break
                if not line.strip():
                    continue
                offset += 1
                if len(line) > self.max_line_bytes:
                    row = self._oversized(offset - 1, line)
                else:
                    row = self._parse(line, offset - 1)
                if row is not None:
                    if not rows:
                        first_at = time.monotonic()
                    rows.append(row)
            head = lines.compact()
            if head is not None:  # a line over the limit began: dead-letter it, drop the rest
                self._oversized(offset, head)
                offset += 1
            now = time.monotonic()
            flush = len(rows) >= self.batch_size or (
                rows and self.linger_s is not None and now - first_at >= self.linger_s
            )
            if flush or (eof and rows):
                yield self._emit(rows, offset)  # training on it is not idle time
                last_hook = time.monotonic()
                rows = []
                continue
            if eof:
                if lines.finish():  # a last line without newline
                    continue
                return
            # only waiting counts: parsing what arrived never ends the pass while more bytes
            # wait in the socket
            if self.max_idle_s is not None and waited >= self.max_idle_s:
                self.end_reason = "idle_timeout"
                eof = True
                continue
            if now - last_hook >= self.poll_interval:
                last_hook = now
                if self._idle():
                    self.end_reason = "stopped"
                    return
            t_recv = time.monotonic()
            try:
                chunk = sock.recv(1 << 16)
            except TimeoutError:
                waited += time.monotonic() - t_recv
                continue
            except OSError as exc:
                log.warning("SocketSource: connection error: %s; ending the stream.", exc)
                self.end_reason = (
                    "connection_reset" if isinstance(exc, ConnectionError) else "connection_error"
                )
                eof = True
                continue
            if not chunk:
                self.end_reason = self.end_reason or "source_exhausted"
                eof = True
                continue
            waited = 0.0
            lines.buf += chunk

    def _oversized(self, pos: int, head: bytes | bytearray) -> None:
        self.dead_letter.write(
            {"offset": pos},
            f"line longer than max_line_bytes={self.max_line_bytes} (dropped)",
            bytes(head[:4096]),
        )
        return None

    def _parse(self, line: bytes, pos: int) -> tuple | None:
        return self._parse_record(self.schema, line, {"offset": pos})

    def _emit(self, rows: list[tuple], offset: int) -> Any:
        self._cursor = {"offset": offset}
        self.records_read += len(rows)
        self.batches_read += 1
        return self.schema.to_batch(self.schema.rows_to_columns(rows))


class _Lines:
    """Received bytes -> complete lines, in linear time and bounded memory.

    One bytearray, searched for newlines from where the last search stopped and compacted
    once per pass; a line growing past ``limit`` bytes is cut: :meth:`compact` returns its
    head once (to dead-letter) and the rest is dropped as it arrives, up to its newline.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.start = 0  # start of the current line
        self.scan = 0  # where the newline search resumes
        self.skipping = False  # dropping the rest of an oversized line

    def pop(self) -> bytes | None:
        """The next complete line (without its newline), or None."""
        while True:
            nl = self.buf.find(b"\n", self.scan)
            if nl < 0:
                self.scan = len(self.buf)
                return None
            line = bytes(self.buf[self.start : nl])
            self.start = self.scan = nl + 1
            if not self.skipping:
                return line
            self.skipping = False  # that was the tail of an oversized line

    def compact(self) -> bytes | None:
        """Drop consumed bytes; the head of a new oversized line, if one just began."""
        if self.start:
            del self.buf[: self.start]
            self.scan -= self.start
            self.start = 0
        head = None
        if self.scan == len(self.buf) and (self.skipping or len(self.buf) > self.limit):
            if not self.skipping:
                head = bytes(self.buf[:4096])
            self.skipping = True
            self.buf.clear()
            self.scan = 0
        return head

    def finish(self) -> bool:
        """At the end of the stream: terminate a last line without newline (True if any)."""
        if self.buf.strip() and not self.skipping:
            self.buf += b"\n"
            return True
        return False
