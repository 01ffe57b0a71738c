"""``SocketSource``: newline-delimited JSON records over a TCP connection."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

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
    ``max_idle_s`` without data. Malformed lines go to the dead-letter file (or the log) with
    ``{"offset": N}``, their record number in the stream.

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
        sock = self._connect()
        try:
            sock.settimeout(self.poll_interval)
            if self.handshake:
                sock.sendall((json.dumps({"resume_from": offset}) + "\n").encode())
            pending = b""
            rows: list[tuple] = []
            first_at = 0.0
            last_data = time.monotonic()
            eof = False
            while True:
                # complete lines in hand -> records
                while b"\n" in pending and len(rows) < self.batch_size:
                    line, pending = pending.split(b"\n", 1)
                    if not line.strip():
                        continue
                    pos = offset
                    offset += 1
                    try:
                        row = self.schema.parse_json(line)
                    except ValueError as exc:
                        self.dead_letter.write({"offset": pos}, str(exc), line)
                        continue
                    if not rows:
                        first_at = time.monotonic()
                    rows.append(row)
                now = time.monotonic()
                flush = len(rows) >= self.batch_size or (
                    rows and self.linger_s is not None and now - first_at >= self.linger_s
                )
                if flush or (eof and rows):
                    yield self._emit(rows, offset)
                    rows = []
                    continue
                if eof:
                    if pending.strip():  # a last line without newline
                        pending += b"\n"
                        continue
                    return
                if self.max_idle_s is not None and now - last_data >= self.max_idle_s:
                    eof = True
                    continue
                try:
                    chunk = sock.recv(1 << 16)
                except TimeoutError:
                    if self._idle():
                        return
                    continue
                except OSError as exc:
                    log.warning("SocketSource: connection error: %s; ending the stream.", exc)
                    eof = True
                    continue
                if not chunk:
                    eof = True
                    continue
                last_data = time.monotonic()
                pending += chunk
        finally:
            sock.close()

    def _emit(self, rows: list[tuple], offset: int) -> Any:
        self._cursor = {"offset": offset}
        self.records_read += len(rows)
        self.batches_read += 1
        return self.schema.to_batch(self.schema.rows_to_columns(rows))
