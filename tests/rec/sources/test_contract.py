"""The :class:`~lit_amp.rec.sources.base.StreamSource` contract, run for every source class.

Every harness of :data:`tests.rec.sources.contract.HARNESSES` goes through the same checks:
``end_reason`` is declared by the base class and set when a pass ends; the end of the data
ends the pass cleanly (``"source_exhausted"``, and a pass from the final cursor yields
nothing); ``max_idle_s`` ends a quiet pass in bounded time and never counts the time the
consumer spends on a batch; the idle hook stops a waiting pass; hostile rows (a fixed table
and hypothesis-drawn lines) are dead-lettered alone and counted, as ``ClickSchema.parse_json``
says, never raised and never yielded; a restart from a saved cursor continues exactly (after
the source was told that cursor is durable and finished its clean-up).
"""

from __future__ import annotations

import importlib
import logging
import pickle
import pkgutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lit_amp.rec.sources as sources
from lit_amp.rec.sources.base import END_REASONS, StreamSource
from tests.rec.sources.contract import (
    BATCH,
    HARNESSES,
    HOSTILE,
    HOSTILE_NAMES,
    hostile_lines,
    ids_of,
    interleaved,
    valid,
    verdict,
)

ENDING = [h for h in HARNESSES if h.ends]
TAILING = [h for h in HARNESSES if h.tails]
RAW = [h for h in HARNESSES if h.raw]


def _name(h) -> str:
    return h.cls.__name__


@pytest.fixture
def harness(request, tmp_path):
    h = request.param(tmp_path)
    yield h
    h.close()


def _each(harnesses):
    return pytest.mark.parametrize("harness", harnesses, indirect=True, ids=_name)


def _assert_trainable(batches) -> None:
    """What reaches the model: finite float32 dense values, int64 ids, 0/1 labels."""
    for f, y in batches:
        assert 0 < len(y) <= BATCH
        assert f["dense"].dtype == torch.float32 and torch.isfinite(f["dense"]).all()
        assert f["cat"].dtype == torch.int64 and f["record_id"].dtype == torch.int64
        assert ((y == 0) | (y == 1)).all()


def _key(position: dict) -> tuple:
    return tuple(sorted(position.items()))


# ------------------------------------------------------------------ declaration
def test_every_source_class_has_a_harness_and_inherits_end_reason():
    found = set()
    for info in pkgutil.iter_modules(sources.__path__):
        mod = importlib.import_module(f"{sources.__name__}.{info.name}")
        found |= {
            obj
            for obj in vars(mod).values()
            if isinstance(obj, type)
            and issubclass(obj, StreamSource)
            and obj is not StreamSource
            and obj.__module__ == mod.__name__
        }
    assert found == {h.cls for h in HARNESSES}, "add a harness to tests/rec/sources/contract.py"
    assert "end_reason" in StreamSource.__annotations__ and StreamSource.end_reason is None
    assert set(END_REASONS) >= {"source_exhausted", "idle_timeout", "stopped"}
    for cls in found:  # declared once, by the base class
        assert "end_reason" not in vars(cls) and "max_idle_s" in dir(cls)


# ------------------------------------------------------------------ the end of the data
@_each(ENDING)
def test_exhaustion_ends_the_pass_cleanly(harness):
    harness.append([valid(i) for i in range(5)])
    harness.append([valid(i) for i in range(5, 11)])
    harness.end()
    src = harness.reader()
    assert src.end_reason is None
    it = iter(src)
    batches = [next(it)]
    assert src.end_reason is None  # a pass under way has no end reason
    batches += list(it)
    assert ids_of(batches) == list(range(11))
    assert [len(y) for _, y in batches] == [4, 4, 3]  # the last, partial batch is yielded
    _assert_trainable(batches)
    assert src.end_reason == "source_exhausted"
    assert next(it, None) is None  # ended for good, by returning
    assert (src.records_read, src.batches_read) == (11, 3)
    again = harness.reader()  # a restart after the end trains nothing
    again.load_state_dict(src.state_dict())
    assert list(again) == [] and again.end_reason == "source_exhausted"


# ------------------------------------------------------------------ idle timeout
@_each(TAILING)
def test_idle_timeout_ends_a_quiet_pass_in_bounded_time(harness):
    limit = 0.3
    src = harness.reader(max_idle_s=limit)
    t0 = time.monotonic()
    assert list(src) == []
    took = time.monotonic() - t0
    assert src.end_reason == "idle_timeout"
    assert limit <= took < limit + 1.5, f"an empty stream ended after {took:.2f} s"
    harness.append([valid(i) for i in range(6)])
    src = harness.reader(max_idle_s=limit)
    t0 = time.monotonic()
    batches = list(src)
    took = time.monotonic() - t0
    assert ids_of(batches) == list(range(6)) and [len(y) for _, y in batches] == [4, 2]
    assert src.end_reason == "idle_timeout"
    assert limit <= took < limit + 1.5, f"a quiet stream ended after {took:.2f} s"


@_each(TAILING)
def test_time_spent_on_a_batch_is_not_idle_time(harness):
    """``max_idle_s=0.5``; the consumer spends 0.6 s on each batch. Two batches are there
    from the start, two more land 0.1 s after the consumer comes back for them: every record
    is read (before: KafkaSource stopped after one batch, training time counted as idle)."""
    harness.append([valid(i) for i in range(2 * BATCH)])
    t0 = time.monotonic()

    def produce() -> None:
        for k, at in ((2, 1.3), (3, 2.0)):
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            harness.append([valid(i) for i in range(k * BATCH, (k + 1) * BATCH)])
        if harness.ends:
            harness.end()

    producer = threading.Thread(target=produce)
    producer.start()
    src = harness.reader(max_idle_s=0.5)
    got = []
    for batch in src:
        got += ids_of([batch])
        time.sleep(0.6)  # "training"
    producer.join()
    assert got == list(range(4 * BATCH))
    assert src.end_reason == ("source_exhausted" if harness.ends else "idle_timeout")


@_each(TAILING)
def test_time_spent_parsing_records_is_not_idle_time(harness, monkeypatch):
    """``max_idle_s=0.3``; parsing a record takes 0.15 s. Three records are there from the
    start, three more land while the first three are parsed: all six are read (before:
    KafkaSource and SocketSource counted the parsing as idle and ended the pass with the
    later three still at the broker or in the socket, ``"idle_timeout"``)."""
    parse = StreamSource._parse_record

    def slow_parse(self, *args):
        time.sleep(0.15)
        return parse(self, *args)

    monkeypatch.setattr(StreamSource, "_parse_record", slow_parse)
    harness.append([valid(i) for i in range(3)])
    timer = threading.Timer(0.1, harness.append, [[valid(i) for i in range(3, 6)]])
    timer.start()
    try:
        src = harness.reader(max_idle_s=0.3)
        batches = list(src)
    finally:
        timer.join()
    assert ids_of(batches) == list(range(6))
    assert src.end_reason == "idle_timeout"


@_each(HARNESSES)
def test_the_idle_hook_stops_a_waiting_pass(harness):
    """The hook is polled while the source waits; once it says stop the pass ends within a
    second, ``"stopped"``, without the partial batch (its records stay after the cursor)."""
    harness.append([valid(i) for i in range(BATCH + 2)])
    src = harness.reader()
    calls = []
    stop_at = time.monotonic() + 0.3
    src.bind_idle(lambda: calls.append(1) or time.monotonic() >= stop_at)
    got = ids_of(src)
    late = time.monotonic() - stop_at
    assert src.end_reason == "stopped"
    assert late < 1.0, f"stopped {late:.2f} s after the hook asked"
    assert len(calls) >= 2
    assert got == list(range(len(got)))
    if harness.tails:
        assert got == list(range(BATCH))


# ------------------------------------------------------------------ bad rows
@_each(RAW)
def test_hostile_rows_are_dead_lettered_alone_and_counted(harness):
    lines = interleaved([raw for _, raw, _ in HOSTILE])
    for k in range(0, len(lines), 2):  # one hostile line per chunk (file): a file of valid
        harness.append(lines[k : k + 2])  # rows but one takes no shortcut past it
    src = harness.finite()
    batches = list(src)
    assert ids_of(batches) == list(range(len(HOSTILE) + 1))  # every neighbour is trained
    _assert_trainable(batches)
    dead = harness.dead()
    expected = harness.expected_dead()
    assert [d["position"] for d in dead] == expected
    assert src.malformed == len(expected) >= len(HOSTILE) - 2  # (blank lines: transport)
    positions = [harness.position(2 * k + 1) for k in range(len(HOSTILE))]
    for (name, _raw, word), pos in zip(HOSTILE, positions):
        if pos is None:
            continue
        entry = dead[expected.index(pos)]
        assert entry["error"] and isinstance(entry["record"], str), name
        if word is not None:
            assert word in entry["error"], (name, entry["error"])
    assert src.end_reason in ("source_exhausted", "idle_timeout")


@pytest.mark.parametrize("harness_cls", RAW, ids=_name)
@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,  # the same examples on every run: a seeded probe, not a flaky one
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(chunks=st.lists(st.lists(hostile_lines, max_size=10), min_size=1, max_size=3))
def test_any_line_is_trained_or_dead_lettered_as_the_schema_says(harness_cls, tmp_path, chunks):
    """Valid, oddly valid and broken records, mutated bytes, random bytes, blank lines: each
    record line is trained or dead-lettered, never both, never raised, as ``parse_json``
    says; positions and the count match."""
    harness = harness_cls(Path(tempfile.mkdtemp(dir=tmp_path)))
    try:
        for chunk in chunks:
            harness.append(chunk)
        src = harness.finite()
        batches = list(src)
        assert ids_of(batches) == harness.expected_ids()
        _assert_trainable(batches)
        assert [d["position"] for d in harness.dead()] == harness.expected_dead()
        assert src.malformed == len(harness.expected_dead())
        assert src.end_reason in ("source_exhausted", "idle_timeout")
    finally:
        harness.close()


@_each(RAW)
def test_an_unwritable_dead_letter_file_sends_bad_rows_to_the_log(harness, caplog):
    caplog.set_level(logging.WARNING)
    (harness.tmp / "not-a-folder").write_text("")
    dead = harness.tmp / "not-a-folder" / "dead.jsonl"
    harness.append(interleaved([b"{broken", b"[" * 9999, None]))
    src = harness.finite(dead_letter_path=dead)
    assert ids_of(src) == [0, 1, 2, 3]
    assert src.malformed == 3
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot write the dead-letter file" in m and str(dead) in m for m in messages) == 1
    assert sum("malformed record at" in m for m in messages) == 3


# ------------------------------------------------------------------ restart
@_each(HARNESSES)
def test_restart_from_a_saved_cursor_continues_exactly(harness):
    """Stop after k batches (every k), keep the cursor (pickled, as a checkpoint does),
    continue with a new reader: the records are those of one uninterrupted pass, nothing
    repeated or skipped, and the final cursor is the same; every bad row is dead-lettered."""
    if harness.raw:
        bad = [b"{broken", None, b"", valid(0, label=7), b"[" * 5000]
        lines = interleaved(bad, first_id=0) + [valid(i) for i in range(6, 14)]
    else:
        lines = [valid(i) for i in range(14)]
    for a, b in ((0, 7), (7, 12), (12, len(lines))):
        harness.append(lines[a:b])
    whole = harness.finite()
    expected = ids_of(whole)
    assert expected == harness.expected_ids() == list(range(14))
    final = whole.state_dict()
    n_batches = -(-len(expected) // BATCH)
    bad_positions = {_key(p) for p in harness.expected_dead()}
    for k in range(n_batches + 1):
        seen = len(harness.dead())
        first = harness.finite()
        it = iter(first)
        head = [next(it) for _ in range(k)]
        state = pickle.loads(pickle.dumps(first.state_dict()))
        it.close()
        first.checkpointed(state)  # a durable checkpoint holds it: clean-up may run ...
        assert first.wait_cleanup(10)  # ... and ends; nothing the restart reads is lost
        again = harness.finite()
        again.load_state_dict(state)
        rest = list(again)
        assert ids_of(head) + ids_of(rest) == expected, f"restart after {k} batches"
        assert again.state_dict() == final
        assert {_key(d["position"]) for d in harness.dead()[seen:]} == bad_positions


def test_the_hostile_table_is_hostile():
    """Each entry of the table the contract feeds every source is a bad record (or a blank
    line) by the schema's own verdict: the table cannot silently go soft."""
    assert len(set(HOSTILE_NAMES)) == len(HOSTILE)
    assert all(verdict(raw) is None for _, raw, _ in HOSTILE)
