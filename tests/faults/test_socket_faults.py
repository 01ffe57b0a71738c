"""#18 items 3 and 13 (socket side): bounded lines, signals honoured while bytes keep coming, a
reset reported as such (the idle clock and the end reasons of every source: test_contract.py)."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc

from lit_amp.rec import StopOptions
from lit_amp.rec.sources import SocketSource
from tests.faults._servers import LineServer, line, record
from tests.rec._helpers import make_model


def ids_of(batches) -> list[int]:
    return [i for f, _ in batches for i in f["record_id"].tolist()]


def test_an_oversized_line_is_dead_lettered_in_bounded_memory_and_time(tmp_path):
    huge = b'{"id": 99, "pad": "' + b"x" * (40 << 20) + b'"}\n'  # 40 MiB on one line
    payload = line(record(0)) + line(record(1)) + huge + line(record(2))
    server = LineServer(payload)
    try:
        dead = tmp_path / "dead.jsonl"
        src = SocketSource("127.0.0.1", server.port, batch_size=2, dead_letter_path=dead,
                           max_line_bytes=1 << 20)
        tracemalloc.start()
        t0 = time.monotonic()
        got = ids_of(list(src))
        elapsed = time.monotonic() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert got == [0, 1, 2]
        assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB while reading a 40 MiB line"
        assert elapsed < 10
        entries = [json.loads(x) for x in dead.read_text().splitlines()]
        assert len(entries) == 1 and entries[0]["position"] == {"offset": 2}
        assert "max_line_bytes" in entries[0]["error"]
        assert dead.stat().st_size < 20_000  # the entry is bounded, not the 40 MiB line
        assert src.state_dict() == {"offset": 4}
    finally:
        server.close()


def test_stop_is_honoured_within_a_second_while_an_endless_line_streams():
    stop = threading.Event()

    def endless(conn):
        conn.sendall(line(record(0)))
        chunk = b"y" * 65536
        t_end = time.monotonic() + 20
        while time.monotonic() < t_end and not stop.is_set():
            conn.sendall(chunk)

    server = LineServer(endless)
    try:
        src = SocketSource("127.0.0.1", server.port, batch_size=10, max_line_bytes=1 << 16)
        asked = []
        src.bind_idle(lambda: bool(asked))
        timer = threading.Timer(0.5, lambda: asked.append(time.monotonic()))
        timer.start()
        list(src)
        took = time.monotonic() - asked[0]
        stop.set()
        assert took < 1.0, f"stop honoured after {took:.2f} s"
        assert src.malformed == 1  # the endless line, dead-lettered once
    finally:
        stop.set()
        server.close()


def test_a_connection_reset_is_reported_as_such_not_as_a_clean_end():
    server = LineServer(b"".join(line(record(i)) for i in range(6)), reset=True)
    try:
        model = make_model()
        summary = model.online_train(
            SocketSource("127.0.0.1", server.port, batch_size=3),
            dataset_sink_mode=False, stop=StopOptions(max_time=30),
        )
        assert summary.stop_reason == "connection_reset", summary
    finally:
        server.close()
