"""#28 item 13: every source keeps the same end-of-stream contract (``StreamSource.end_reason``).

For each source class of ``lit_amp.rec.sources``: ``end_reason`` is a declared attribute
(None until a pass ends); a pass that ends because the data ended says
``"source_exhausted"``, one that ends after ``max_idle_s`` without data says
``"idle_timeout"``, one ended by the idle hook says ``"stopped"``; and a consumer slower than
``max_idle_s`` per batch still gets every record that was already there (the idle clock
never counts time spent training). A new source class must be added to the table below.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

import lit_amp.rec.sources as sources
from lit_amp.rec.sources import (
    DirectorySource,
    KafkaSource,
    SocketSource,
    StreamSource,
    SyntheticClickSource,
)
from tests.faults._servers import LineServer, line, record
from tests.rec.sources.test_other_sources import FakeConsumer

N = 9  # records of every stream; batches of 3


def _lines() -> bytes:
    return b"".join(line(record(i)) for i in range(N))


@contextmanager
def _directory(tmp_path, *, end: bool, **kw) -> Iterator[StreamSource]:
    for k in range(3):
        (tmp_path / f"part-{k}.jsonl").write_bytes(
            b"".join(line(record(i)) for i in range(3 * k, 3 * k + 3))
        )
    if end:
        (tmp_path / "_END").write_text("")
    yield DirectorySource(tmp_path, batch_size=3, poll_interval=0.01, **kw)


@contextmanager
def _socket(tmp_path, *, end: bool, **kw) -> Iterator[StreamSource]:
    """``end``: the server closes after the records; else it keeps the connection open."""
    release = threading.Event()

    def payload(conn):
        conn.sendall(_lines())
        if not end:
            release.wait(20)

    server = LineServer(payload)
    try:
        yield SocketSource(
            "127.0.0.1",
            server.port,
            batch_size=3,
            poll_interval=0.01,
            dead_letter_path=tmp_path / "dead.jsonl",
            **kw,
        )
    finally:
        release.set()
        server.close()


@contextmanager
def _kafka(tmp_path, *, end: bool, **kw) -> Iterator[StreamSource]:
    assert not end  # a topic has no end
    values = [line(record(i)).rstrip(b"\n") for i in range(N)]
    yield KafkaSource(
        "clicks",
        batch_size=3,
        consumer_factory=lambda: FakeConsumer({0: values}),
        poll_timeout_s=0.01,
        **kw,
    )


@contextmanager
def _synthetic(tmp_path, *, end: bool, **kw) -> Iterator[StreamSource]:
    # endless with a rate: the idle hook is polled while it waits for the next batch
    yield SyntheticClickSource(
        batch_size=3, num_records=N if end else None, rate=None if end else 30.0
    )


# class -> (factory, ends by itself, has an idle clock)
SOURCES: dict[type, tuple[Callable, bool, bool]] = {
    DirectorySource: (_directory, True, True),
    SocketSource: (_socket, True, True),
    KafkaSource: (_kafka, False, True),
    SyntheticClickSource: (_synthetic, True, False),
}
ENDING = [c for c, (_, ends, _) in SOURCES.items() if ends]
IDLING = [c for c, (_, _, idle) in SOURCES.items() if idle]


def _ids(batches) -> list[int]:
    return [i for f, _ in batches for i in f["record_id"].tolist()]


def test_every_source_class_is_in_the_contract_table():
    found = {
        obj
        for obj in vars(sources).values()
        if isinstance(obj, type) and issubclass(obj, StreamSource) and obj is not StreamSource
    }
    assert found == set(SOURCES)
    assert "end_reason" in vars(StreamSource) and StreamSource.end_reason is None
    assert "end_reason" in (StreamSource.__doc__ or "")


@pytest.mark.parametrize("cls", ENDING, ids=lambda c: c.__name__)
def test_a_source_that_runs_out_says_source_exhausted(cls, tmp_path):
    factory = SOURCES[cls][0]
    with factory(tmp_path, end=True) as src:
        assert src.end_reason is None
        assert sorted(_ids(src)) == list(range(N))
        assert src.end_reason == "source_exhausted"


@pytest.mark.parametrize("cls", IDLING, ids=lambda c: c.__name__)
def test_a_source_idle_for_max_idle_s_says_idle_timeout(cls, tmp_path):
    factory = SOURCES[cls][0]
    with factory(tmp_path, end=False, max_idle_s=0.2) as src:
        assert src.end_reason is None
        assert sorted(_ids(src)) == list(range(N))
        assert src.end_reason == "idle_timeout"


@pytest.mark.parametrize("cls", list(SOURCES), ids=lambda c: c.__name__)
def test_a_source_ended_by_the_idle_hook_says_stopped(cls, tmp_path):
    factory = SOURCES[cls][0]
    with factory(tmp_path, end=False) as src:
        src.bind_idle(lambda: True)
        list(src)
        assert src.end_reason == "stopped"


@pytest.mark.parametrize("cls", IDLING, ids=lambda c: c.__name__)
def test_time_spent_training_is_not_idle_time(cls, tmp_path):
    """All records are there from the start; the consumer trains 0.4 s per batch with
    ``max_idle_s=0.3``: it must get all of them (before: KafkaSource stopped after one
    batch, the training time counted as idle)."""
    factory = SOURCES[cls][0]
    got = []
    with factory(tmp_path, end=False, max_idle_s=0.3) as src:
        for batch in src:
            got += _ids([batch])
            time.sleep(0.4)
        assert sorted(got) == list(range(N))
        assert src.end_reason == "idle_timeout"
