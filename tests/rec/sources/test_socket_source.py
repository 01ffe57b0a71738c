"""What is particular to ``SocketSource`` (``lit_amp.rec.sources.socket_source``; 127.0.0.1 only):
a refused connection fails in bounded time, argument checks. What every source must do is in
test_contract.py."""

from __future__ import annotations

import socket
import time

import pytest

from lit_amp.rec.sources import SocketSource


def test_socket_source_connection_refused_is_bounded():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    src = SocketSource("127.0.0.1", port, connect_timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="cannot connect"):
        next(iter(src))
    assert time.monotonic() - t0 < 5


def test_socket_bad_arguments():
    with pytest.raises(ValueError, match="'port' must be an int"):
        SocketSource("127.0.0.1", 0)
