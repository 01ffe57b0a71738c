"""The stream-source contract tester: one harness per source class, in one registry.

A harness puts raw record lines where its source class reads them (files in a folder, a
loopback server honouring the resume handshake, an in-memory Kafka log, the synthetic
generator's own count) and builds readers of them. ``tests/rec/sources/test_contract.py``
runs every harness of :data:`HARNESSES` through the same checks (end reasons, exhaustion,
idle timeout, bad rows, restart from a cursor). Adding a source = its module + one harness
class here + its entry in :data:`HARNESSES`; the registry test fails until it is there.
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from collections import namedtuple
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from hypothesis import strategies as st

from lit_amp.rec.sources import (
    DirectorySource,
    KafkaSource,
    SocketSource,
    StreamSource,
    SyntheticClickSource,
)
from lit_amp.rec.sources.schema import ClickSchema
from tests.faults._servers import LineServer, line, record

BATCH = 4  # records per batch of every reader
IDLE_END = 0.1  # max_idle_s that ends a finite pass of a source that cannot be told "the end"

Line = bytes | None  # a raw record; None: a record without a value (a Kafka tombstone)


def ids_of(batches) -> list[int]:
    return [i for f, _ in batches for i in f["record_id"].tolist()]


def valid(i: int, **over: Any) -> bytes:
    """A valid record line with id ``i``."""
    return line(record(i, **over)).rstrip(b"\n")


def verdict(raw: Line) -> int | None:
    """The oracle every source must agree with: the id ``ClickSchema.parse_json`` gives the
    line, or None when it rejects it."""
    try:
        return ClickSchema().parse_json(raw)[0]
    except ValueError:
        return None


# ------------------------------------------------------------------ hostile lines
_V = valid(0)
#: (name, the line, a word the dead-letter reason must hold, or None)
HOSTILE: list[tuple[str, Line, str | None]] = [
    ("tombstone", None, None),
    ("json_null", b"null", None),
    ("not_json", b"{broken", "JSON"),
    ("truncated", _V[:20], "JSON"),
    ("two_records_on_one_line", valid(1) + b", " + valid(2), "JSON"),
    ("a_list_not_an_object", b"[1, 2, 3]", "object"),
    ("deep_list", b"[" * 100_000, "nested too deeply"),
    ("deep_object", b'{"a":' * 50_000, None),
    ("deep_closed", b"[" * 5_000 + b"]" * 5_000, None),
    ("invalid_utf8", b'{"id": 1, "label": 0, "dense": "\xff\xfe"}', None),
    ("invalid_utf8_alone", b"\xff\xfe\xfd", None),
    ("control_bytes", b"\x00\x01\x02", None),
    ("missing_field", json.dumps({"id": 1, "label": 0, "dense": [1.0] * 13}).encode(), "cat"),
    ("dense_arity_12", valid(0, dense=[1.0] * 12), "dense"),
    ("dense_arity_14", valid(0, dense=[1.0] * 14), "dense"),
    ("cat_arity_25", valid(0, cat=[1] * 25), "cat"),
    ("id_is_a_string", valid(0, id="7"), "id"),
    ("id_is_a_float", valid(0, id=1.5), "id"),
    ("label_is_7", valid(0, label=7), "label"),
    ("label_is_a_bool", valid(0, label=True), "label"),
    ("dense_is_a_dict", valid(0, dense={"a": 1}), "dense"),
    ("dense_holds_a_string", valid(0, dense=["1"] + [1.0] * 12), "dense"),
    ("cat_holds_a_float", valid(0, cat=[1.5] * 26), None),
    ("cat_negative", valid(0, cat=[-1] * 26), "negative"),
    ("nan_dense", _V.replace(b"[1.0,", b"[NaN,", 1), "float32"),
    ("infinity_dense", _V.replace(b"[1.0,", b"[-Infinity,", 1), "float32"),
    ("nan_label", _V.replace(b'"label": 0', b'"label": NaN'), "label"),
    ("dense_overflows_float32", valid(0, dense=[1e39] + [1.0] * 12), "float32"),
    ("dense_int_over_float64", valid(0, dense=[10**400] + [1.0] * 12), "float32"),
    ("float_literal_overflow", _V.replace(b"[1.0,", b"[1e999,", 1), "float32"),
    ("id_over_int64", valid(0, id=2**63), "int64"),
    ("id_huge", valid(0, id=10**30), "int64"),
    ("cat_over_int64", valid(0, cat=[2**64 + 5] + [1] * 25), "int64"),
    ("int_literal_5000_digits", b'{"id": ' + b"9" * 5000 + b"}", None),
    ("empty", b"", None),
    ("whitespace", b" \t ", None),
]
HOSTILE_NAMES = [h[0] for h in HOSTILE]


def interleaved(bad: Sequence[Line], first_id: int = 0) -> list[Line]:
    """Valid records ``first_id, first_id + 1, ...`` with one of ``bad`` after each."""
    out: list[Line] = []
    for k, raw in enumerate(bad):
        out += [valid(first_id + k), raw]
    out.append(valid(first_id + len(bad)))
    return out


# ------------------------------------------------------------------ hypothesis strategies
_ANY_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**62, max_value=2**70),
    st.floats(),  # NaN and +-inf included
    st.text(max_size=6),
    st.lists(st.integers(), max_size=2),
)
_DENSE_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(-3e38, 3e38, allow_nan=False)
)
_CAT_VALUE = st.one_of(st.integers(0, 2**63 - 1), st.text(max_size=5))


@st.composite
def record_lines(draw: Any) -> bytes:
    """A record that is valid, oddly valid (null dense, string ids, label 1.0, booleans) or
    broken in one field: wrong arity, a non-numeric or non-finite value, a huge number."""
    rec: dict[str, Any] = {
        "id": draw(st.integers(-(2**63), 2**63 - 1)),
        "label": draw(st.sampled_from([0, 1, 0.0, 1.0])),
        "dense": draw(st.lists(_DENSE_VALUE, min_size=13, max_size=13)),
        "cat": draw(st.lists(_CAT_VALUE, min_size=26, max_size=26)),
    }
    broken = draw(st.sampled_from([None, None, "id", "label", "dense", "cat", "arity", "drop"]))
    if broken in ("id", "label"):
        rec[broken] = draw(_ANY_SCALAR)
    elif broken in ("dense", "cat"):
        rec[broken][draw(st.integers(0, len(rec[broken]) - 1))] = draw(_ANY_SCALAR)
    elif broken == "arity":
        key = draw(st.sampled_from(["dense", "cat"]))
        n = draw(st.integers(0, 40).filter(lambda n: n not in (13, 26)))
        rec[key] = (rec[key] * 4)[:n]
    elif broken == "drop":
        del rec[draw(st.sampled_from(sorted(rec)))]
    return json.dumps(rec).encode()


_TOKENS = [b"[", b"{", b"]", b"}", b'"', b",", b":", b"null", b"NaN", b"-Infinity", b"1e400",
           b"9" * 400, b"\xff", b"\xc3", b"\\u0000", b"\\ud800", b"true"]


@st.composite
def mutated_lines(draw: Any) -> bytes:
    """A valid record after 1-4 byte-level mutations: flips, cuts, tokens, deep nesting."""
    b = bytearray(valid(3))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(b)))
        op = draw(st.integers(0, 4))
        if op == 0 and b:
            b[min(pos, len(b) - 1)] = draw(st.integers(0, 255))
        elif op == 1:
            del b[pos : pos + draw(st.integers(1, 20))]
        elif op == 2:
            b[pos:pos] = draw(st.sampled_from(_TOKENS))
        elif op == 3:
            depth = draw(st.sampled_from([10, 1000, 3000, 60_000]))
            b[pos:pos] = draw(st.sampled_from([b"[", b'{"x":'])) * depth
        else:
            del b[pos:]
    return bytes(b)


def _one_line(raw: bytes) -> bytes:
    # line transports frame records on newlines (a file also on "\r")
    return raw.replace(b"\n", b" ").replace(b"\r", b" ")


#: One raw line of a hostile stream.
hostile_lines = st.one_of(
    record_lines(),
    record_lines(),
    mutated_lines(),
    st.lists(record_lines(), min_size=2, max_size=3).map(b", ".join),  # records on one line
    st.sampled_from([h[1] for h in HOSTILE]),
    st.binary(max_size=40),
    st.sampled_from([b"", b" ", b"\t", b"\x0b\x0c"]),
).map(lambda raw: raw if raw is None else _one_line(raw))


# ------------------------------------------------------------------ harnesses
class SourceHarness:
    """Raw record lines where one source class reads them, and readers of those lines.

    Flags (what the contract can ask of the class):

    - ``ends``: the data can be ended (:meth:`end`) and the source then says
      ``"source_exhausted"``.
    - ``tails``: the source waits for data that lands later, with ``max_idle_s`` and the idle
      hook polled while it waits.
    - ``raw``: the source reads raw lines, so hostile rows can reach it.

    Args:
        tmp: a fresh folder for this harness's files.
    """

    cls: ClassVar[type[StreamSource]]
    ends: ClassVar[bool] = True
    tails: ClassVar[bool] = True
    raw: ClassVar[bool] = True

    def __init__(self, tmp: Path) -> None:
        self.tmp = Path(tmp)
        self.lines: list[Line] = []
        self.ended = False

    @property
    def dead_path(self) -> Path:
        return self.tmp / "dead.jsonl"

    def append(self, lines: Sequence[Line]) -> None:
        """Make ``lines`` readable now (after the lines appended before)."""
        self.lines += list(lines)

    def end(self) -> None:
        """Mark the data as ended (only with ``ends``)."""
        self.ended = True

    def reader(self, **kw: Any) -> StreamSource:
        """A new reader of the lines (a fresh object: a restart), ``BATCH`` records a batch."""
        raise NotImplementedError

    def finite(self, **kw: Any) -> StreamSource:
        """A reader whose pass ends once every line is read: the data is ended if the source
        can be told, else the reader idles out after ``IDLE_END`` seconds."""
        if self.ends:
            self.end()
            return self.reader(**kw)
        return self.reader(max_idle_s=IDLE_END, **kw)

    def position(self, i: int) -> dict | None:
        """The dead-letter position of line ``i``, or None where the transport carries no
        record for it (a blank line of a line-delimited stream)."""
        raise NotImplementedError

    def expected_ids(self) -> list[int]:
        return [rid for raw in self.lines if (rid := verdict(raw)) is not None]

    def expected_dead(self) -> list[dict]:
        """Positions of the lines that are records and that the oracle rejects, in order."""
        return [
            pos
            for i, raw in enumerate(self.lines)
            if (pos := self.position(i)) is not None and verdict(raw) is None
        ]

    def dead(self) -> list[dict]:
        """The dead-letter entries written so far."""
        if not self.dead_path.exists():
            return []
        return [json.loads(x) for x in self.dead_path.read_text().splitlines()]

    def close(self) -> None:
        """Release servers and threads."""


def _as_line(raw: Line) -> bytes:
    return b"null" if raw is None else raw


class DirectoryHarness(SourceHarness):
    """Each :meth:`append` is one ``.jsonl`` file, renamed into the folder; the end is
    ``_END``."""

    cls = DirectorySource

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.folder = self.tmp / "data"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.where: list[tuple[str, int]] = []  # (file, row) of each line

    def append(self, lines: Sequence[Line]) -> None:
        if not lines:
            return
        name = f"part-{len({f for f, _ in self.where}):06d}.jsonl"
        tmp = self.folder / f".{name}.tmp"
        tmp.write_bytes(b"\n".join(_as_line(raw) for raw in lines) + b"\n")
        os.replace(tmp, self.folder / name)
        self.where += [(name, row) for row in range(len(lines))]
        super().append(lines)

    def end(self) -> None:
        (self.folder / "_END").write_text("")
        super().end()

    def reader(self, **kw: Any) -> StreamSource:
        kw.setdefault("dead_letter_path", self.dead_path)
        return DirectorySource(self.folder, batch_size=BATCH, poll_interval=0.01, **kw)

    def position(self, i: int) -> dict | None:
        if not _as_line(self.lines[i]).strip():
            return None
        name, row = self.where[i]
        return {"file": name, "row": row}


def _peer_gone(conn: socket.socket) -> bool:
    if not select.select([conn], [], [], 0)[0]:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class SocketHarness(SourceHarness):
    """A loopback server (:class:`tests.faults._servers.LineServer`) that replays the lines
    from the client's ``resume_from``, streams later ones as they are appended, and closes
    the connection once the data is ended."""

    cls = SocketSource

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.cond = threading.Condition()
        self.closed = False
        self.server = LineServer(self._serve)

    def _serve(self, conn: socket.socket) -> None:
        skip = self.server.hellos[-1]["resume_from"] if self.server.hellos else 0
        sent = 0
        while True:
            with self.cond:
                while sent == len(self.lines) and not (self.ended or self.closed):
                    self.cond.wait(0.05)
                    if _peer_gone(conn):
                        return
                new, done = self.lines[sent:], self.ended or self.closed
                sent += len(new)
            out = []
            for raw in map(_as_line, new):
                if skip and raw.strip():  # a record before the cursor: not sent again
                    skip -= 1
                elif not skip:
                    out.append(raw + b"\n")
            if out:
                conn.sendall(b"".join(out))
            if done:
                return

    def append(self, lines: Sequence[Line]) -> None:
        with self.cond:
            super().append(lines)
            self.cond.notify_all()

    def end(self) -> None:
        with self.cond:
            super().end()
            self.cond.notify_all()

    def reader(self, **kw: Any) -> StreamSource:
        kw.setdefault("dead_letter_path", self.dead_path)
        return SocketSource(
            "127.0.0.1", self.server.port, batch_size=BATCH, poll_interval=0.01, **kw
        )

    def position(self, i: int) -> dict | None:
        if not _as_line(self.lines[i]).strip():
            return None
        return {"offset": sum(1 for raw in self.lines[:i] if _as_line(raw).strip())}

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.server.close()


KafkaRecord = namedtuple("KafkaRecord", "topic partition offset value")


class FakeConsumer:
    """kafka-python's consumer surface over in-memory partitions (read live: values appended
    to a partition's list later are polled too); 3 records per partition and poll."""

    def __init__(self, logs: dict[int, list[Line]]) -> None:
        self.logs = logs
        self.pos: dict[int, int] = {}
        self.assigned: list = []
        self.closed = False

    def partitions_for_topic(self, topic):
        return set(self.logs)

    def assign(self, tps):
        self.assigned = list(tps)
        self.pos = {tp.partition: 0 for tp in tps}

    def seek(self, tp, offset):
        self.pos[tp.partition] = offset

    def poll(self, timeout_ms=0, max_records=None):
        out = {}
        for tp in self.assigned:
            p = tp.partition
            recs = self.logs[p][self.pos[p] : self.pos[p] + 3]
            if recs:
                out[tp] = [KafkaRecord(tp.topic, p, self.pos[p] + i, v) for i, v in enumerate(recs)]
                self.pos[p] += len(recs)
        if not out:
            time.sleep(timeout_ms / 1000)
        return out

    def close(self):
        self.closed = True


class KafkaHarness(SourceHarness):
    """One partition of topic ``clicks``, each line one record value (a topic has no end)."""

    cls = KafkaSource
    ends = False

    def reader(self, **kw: Any) -> StreamSource:
        kw.setdefault("dead_letter_path", self.dead_path)
        log = self.lines  # read live by every consumer
        return KafkaSource(
            "clicks",
            batch_size=BATCH,
            consumer_factory=lambda: FakeConsumer({0: log}),
            poll_timeout_s=0.01,
            **kw,
        )

    def position(self, i: int) -> dict | None:
        return {"topic": "clicks", "partition": 0, "offset": i}


class SyntheticHarness(SourceHarness):
    """The generator makes its own records: the lines only say how many (ids 0, 1, ...).
    Not ended, it is endless at 20 records/s (so its idle hook runs while it waits)."""

    cls = SyntheticClickSource
    tails = False
    raw = False

    def append(self, lines: Sequence[Line]) -> None:
        for k, raw in enumerate(lines):
            assert verdict(raw) == len(self.lines) + k, "synthetic ids are 0, 1, 2, ..."
        super().append(lines)

    def reader(self, **kw: Any) -> StreamSource:
        n = len(self.lines) if self.ended else None
        return SyntheticClickSource(
            batch_size=BATCH, num_records=n, rate=None if self.ended else 20.0, **kw
        )

    def position(self, i: int) -> dict | None:
        return None


#: Every stream source class, through its harness (the registry the contract runs over).
HARNESSES: list[type[SourceHarness]] = [
    DirectoryHarness,
    SocketHarness,
    KafkaHarness,
    SyntheticHarness,
]
