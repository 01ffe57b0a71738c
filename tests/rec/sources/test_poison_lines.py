"""#28 items 8-9: one malformed-record path for every source.

The same hostile lines — a Kafka tombstone (value ``None`` / JSON ``null``), JSON nested too
deeply for the decoder, invalid UTF-8, NaN / Infinity, wrong types, numbers out of range —
go through DirectorySource, SocketSource and KafkaSource: each is dead-lettered alone, with
its position and reason, its neighbours are trained, and nothing is raised. A seeded probe of
mutated records checks the same for lines nobody thought of.
"""

from __future__ import annotations

import json
import random

import pytest

from lit_amp.rec import StopOptions
from lit_amp.rec.sources import DirectorySource, KafkaSource, SocketSource
from lit_amp.rec.sources.schema import ClickSchema
from tests.faults._servers import LineServer, line, record
from tests.rec._helpers import make_model
from tests.rec.sources.test_other_sources import FakeConsumer

VALID = line(record(0)).rstrip(b"\n")
# (name, the line as a file or a socket carries it, the value a Kafka record carries)
POISON: list[tuple[str, bytes, bytes | None]] = [
    ("tombstone", b"null", None),
    ("deep_list", b"[" * 100_000, b"[" * 100_000),
    ("deep_object", b'{"a":' * 50_000, b'{"a":' * 50_000),
    ("deep_closed", b"[" * 5_000 + b"]" * 5_000, b"[" * 5_000 + b"]" * 5_000),
    ("invalid_utf8", b'{"id": 1, "label": 0, "dense": "\xff\xfe"}', b"\xff\xfe\xfd"),
    ("nan_dense", VALID.replace(b"[1.0,", b"[NaN,", 1), VALID.replace(b"[1.0,", b"[NaN,", 1)),
    ("infinity_dense", VALID.replace(b"[1.0,", b"[-Infinity,", 1), b'{"id": Infinity}'),
    ("nan_label", VALID.replace(b'"label": 0', b'"label": NaN'), b'{"label": NaN}'),
    ("id_is_a_string", line(record(0, id="7")).rstrip(), line(record(0, id="7")).rstrip()),
    ("dense_is_a_dict", line(record(0, dense={"a": 1})).rstrip(), b'{"dense": {}}'),
    (
        "dense_holds_a_string",
        line(record(0, dense=["1"] + [1.0] * 12)).rstrip(),
        line(record(0, dense=["1"] + [1.0] * 12)).rstrip(),
    ),
    ("cat_holds_a_float", line(record(0, cat=[1.5] * 26)).rstrip(), b'{"cat": [1.5]}'),
    ("id_huge", line(record(0, id=10**30)).rstrip(), line(record(0, id=10**30)).rstrip()),
    ("int_literal_5000_digits", b'{"id": ' + b"9" * 5000 + b"}", b"9" * 5000),
    ("float_literal_overflow", VALID.replace(b"[1.0,", b"[1e999,", 1), b"1e999"),
    ("truncated", VALID[:20], VALID[:20]),
    ("a_list_not_an_object", b"[1, 2, 3]", b"[]"),
    ("control_bytes", b"\x00\x01\x02", b"\x00"),
]
NAMES = [p[0] for p in POISON]


def ids_of(batches) -> list[int]:
    return [i for f, _ in batches for i in f["record_id"].tolist()]


def _dead(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _stream_lines() -> tuple[list[bytes], list[int], list[int]]:
    """Valid records 0, 2, 4, ... with a poison line after each: (lines, valid ids, bad rows)."""
    lines, good, bad = [], [], []
    for k, (_name, raw, _kafka) in enumerate(POISON):
        good.append(2 * k)
        lines.append(line(record(2 * k)).rstrip(b"\n"))
        bad.append(len(lines))
        lines.append(raw)
    good.append(2 * len(POISON))
    lines.append(line(record(2 * len(POISON))).rstrip(b"\n"))
    return lines, good, bad


@pytest.mark.parametrize(("name", "raw", "kafka_value"), POISON, ids=NAMES)
def test_parse_json_turns_every_hostile_line_into_a_value_error(name, raw, kafka_value):
    schema = ClickSchema()
    for value in (raw, kafka_value, raw.decode("latin-1")):
        with pytest.raises(ValueError) as info:
            schema.parse_json(value)
        assert str(info.value)  # a reason for the dead-letter entry


@pytest.mark.parametrize(("name", "raw", "kafka_value"), POISON, ids=NAMES)
def test_one_poison_line_in_a_file_of_valid_rows_is_dead_lettered_alone(
    tmp_path, name, raw, kafka_value
):
    rows = [line(record(i)).rstrip(b"\n") for i in range(4)]
    (tmp_path / "part-0.jsonl").write_bytes(b"\n".join([*rows[:2], raw, *rows[2:]]) + b"\n")
    src = DirectorySource(tmp_path, batch_size=10, max_idle_s=0)
    assert ids_of(src) == [0, 1, 2, 3]
    assert [d["position"] for d in _dead(tmp_path / "_dead_letter.jsonl")] == [
        {"file": "part-0.jsonl", "row": 2}
    ]


def test_directory_source_dead_letters_only_the_poison_rows_of_a_file(tmp_path):
    lines, good, bad = _stream_lines()
    (tmp_path / "part-0.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    src = DirectorySource(tmp_path, batch_size=4, max_idle_s=0)
    assert ids_of(src) == good  # every neighbour in the same file is trained
    dead = _dead(tmp_path / "_dead_letter.jsonl")
    assert [d["position"] for d in dead] == [{"file": "part-0.jsonl", "row": r} for r in bad]
    assert src.malformed == len(POISON)
    assert "nested too deeply" in dead[NAMES.index("deep_list")]["error"]


def test_socket_source_dead_letters_only_the_poison_lines(tmp_path):
    lines, good, bad = _stream_lines()
    server = LineServer(b"\n".join(lines) + b"\n")
    try:
        dead = tmp_path / "dead.jsonl"
        src = SocketSource("127.0.0.1", server.port, batch_size=4, dead_letter_path=dead)
        assert ids_of(src) == good  # no RecursionError: the connection keeps going
        assert [d["position"] for d in _dead(dead)] == [{"offset": r} for r in bad]
        assert src.state_dict() == {"offset": len(lines)}
        assert src.end_reason == "source_exhausted"
    finally:
        server.close()


def test_kafka_source_dead_letters_tombstones_and_poison_values(tmp_path):
    values: list[bytes | None] = []
    good = []
    for k, (_name, _raw, kafka_value) in enumerate(POISON):
        good.append(2 * k)
        values += [line(record(2 * k)).rstrip(b"\n"), kafka_value]
    dead = tmp_path / "dead.jsonl"
    src = KafkaSource(
        "clicks",
        batch_size=5,
        consumer_factory=lambda: FakeConsumer({0: values}),
        max_idle_s=0.1,
        poll_timeout_s=0.01,
        dead_letter_path=dead,
    )
    assert ids_of(src) == good
    entries = _dead(dead)
    assert [d["position"] for d in entries] == [
        {"topic": "clicks", "partition": 0, "offset": 2 * k + 1} for k in range(len(POISON))
    ]
    tomb = entries[NAMES.index("tombstone")]
    assert "None" in tomb["error"] and tomb["record"] == "null"
    assert src.state_dict() == {"offsets": {"clicks:0": len(values)}}


def test_online_train_over_a_topic_with_a_tombstone_trains_past_it(tmp_path):
    """What a user sees: the run neither crashes nor stops at the tombstone, and says why it
    ended (``idle_timeout``, #28 item 13, not ``source_exhausted``)."""
    values = [line(record(i)).rstrip(b"\n") for i in range(12)]
    values[4] = None  # a compacted topic's deleted key
    src = KafkaSource(
        "clicks",
        batch_size=4,
        consumer_factory=lambda: FakeConsumer({0: values}),
        max_idle_s=0.2,
        poll_timeout_s=0.01,
    )
    summary = make_model().online_train(
        src, dataset_sink_mode=False, stop=StopOptions(max_steps=50)
    )
    assert summary.records == 11
    assert src.malformed == 1
    assert summary.stop_reason == "idle_timeout"


# ------------------------------------------------------------------ a seeded probe
def _mutations(seed: int, n: int) -> list[bytes]:
    """Hostile variants of a valid record: byte flips, cuts, splices, nesting, big numbers."""
    rng = random.Random(seed)
    base = line(record(3)).rstrip(b"\n")
    tokens = [
        b"[",
        b"{",
        b"]",
        b"}",
        b'"',
        b",",
        b":",
        b"null",
        b"NaN",
        b"-Infinity",
        b"1e400",
        b"9" * 400,
        b"\xff",
        b"\xc3",
        b"\\u0000",
        b"\\ud800",
        b"true",
    ]
    out = []
    for _ in range(n):
        b = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(5)
            pos = rng.randrange(len(b) + 1)
            if op == 0 and b:
                b[min(pos, len(b) - 1)] = rng.randrange(256)
            elif op == 1:
                del b[pos : pos + rng.randint(1, 20)]
            elif op == 2:
                b[pos:pos] = rng.choice(tokens)
            elif op == 3:
                depth = rng.choice((10, 1000, 3000, 60_000))
                b[pos:pos] = rng.choice((b"[", b'{"x":')) * depth
            else:
                b = b[:pos]
        out.append(bytes(b).replace(b"\n", b" ").replace(b"\r", b" "))
    return out


def test_seeded_probe_of_mutated_records_never_crashes_and_loses_nothing(tmp_path):
    """300 mutated lines between valid ones: each line is trained or dead-lettered, never both,
    never raised; the verdict matches ``parse_json``'s; the valid neighbours are all read."""
    schema = ClickSchema()
    hostile = [m for m in _mutations(seed=28, n=300) if m.strip()]
    lines, expect_ids, expect_bad = [], [], []
    for k, m in enumerate(hostile):
        lines.append(line(record(10_000 + k)).rstrip(b"\n"))
        expect_ids.append(10_000 + k)
        try:
            expect_ids.append(schema.parse_json(m)[0])
        except ValueError:
            expect_bad.append(len(lines))
        lines.append(m)
    assert len(expect_bad) > 200  # the probe is hostile
    (tmp_path / "part-0.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    src = DirectorySource(tmp_path, batch_size=64, max_idle_s=0)
    assert ids_of(src) == expect_ids
    assert [d["position"]["row"] for d in _dead(tmp_path / "_dead_letter.jsonl")] == expect_bad
