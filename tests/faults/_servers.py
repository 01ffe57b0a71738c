"""A loopback NDJSON server for the socket fault tests: sends given raw lines, then closes."""

from __future__ import annotations

import json
import socket
import threading


def record(i: int, **over) -> dict:
    """A valid Criteo-like record with id ``i`` (fields overridable)."""
    rec = {"id": i, "label": i % 2, "dense": [1.0] * 13, "cat": [i % 50] * 26}
    rec.update(over)
    return rec


def line(rec: dict) -> bytes:
    return (json.dumps(rec) + "\n").encode()


class LineServer:
    """Serves ``payload`` (bytes, or a callable(conn)) to each client after its handshake."""

    def __init__(self, payload, *, reset: bool = False) -> None:
        self.payload = payload
        self.reset = reset
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(30)
        self.port = self.sock.getsockname()[1]
        self.hellos: list[dict] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                conn.settimeout(30)
                hello = b""
                while not hello.endswith(b"\n"):
                    c = conn.recv(1)
                    if not c:
                        break
                    hello += c
                if hello:
                    self.hellos.append(json.loads(hello))
                if callable(self.payload):
                    self.payload(conn)
                else:
                    conn.sendall(self.payload)
                if self.reset:  # RST instead of FIN
                    import struct

                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
            except (OSError, ValueError):
                continue

    def close(self) -> None:
        self.sock.close()
