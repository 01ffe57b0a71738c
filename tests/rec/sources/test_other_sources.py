"""What is particular to SyntheticClickSource, SocketSource and KafkaSource (sharding, seeding,
arguments, several partitions); what every source must do is in test_contract.py."""

from __future__ import annotations

import json
import socket
import sys
import time

import numpy as np
import pytest
import torch

from lit_amp.rec.sources import KafkaSource, SocketSource, SyntheticClickSource, TopicPartition
from lit_amp.rec.sources.schema import ClickSchema
from tests.rec.sources.contract import FakeConsumer


def ids_of(batches) -> list[int]:
    return [i for f, _ in batches for i in f["record_id"].tolist()]


# ------------------------------------------------------------------ synthetic
def test_synthetic_is_seeded_and_resumable():
    a = SyntheticClickSource(batch_size=8, num_records=40, seed=5)
    b = SyntheticClickSource(batch_size=8, num_records=40, seed=5)
    it = iter(b)
    head = [next(it), next(it)]
    c = SyntheticClickSource(batch_size=8, num_records=40, seed=5)
    c.load_state_dict(b.state_dict())
    whole = list(a)
    rest = list(c)
    for x, y in zip(whole, head + rest):
        assert torch.equal(x[0]["cat"], y[0]["cat"]) and torch.equal(x[1], y[1])
    assert ids_of(whole) == list(range(40))
    other = next(iter(SyntheticClickSource(8, seed=6)))
    assert not torch.equal(whole[0][0]["cat"], other[0]["cat"])


def test_synthetic_looks_like_criteo_and_is_learnable():
    cols = SyntheticClickSource(batch_size=20000, seed=0).columns(0)
    assert cols["dense"].shape == (20000, 13) and cols["cat"].shape == (20000, 26)
    assert 0.1 < cols["label"].mean() < 0.5
    # the hidden model makes the label depend on the features
    cat0 = cols["cat"][:, 0]
    rates = [cols["label"][cat0 == v].mean() for v in range(3)]
    assert max(rates) - min(rates) > 0.05


def test_synthetic_rate_and_shards():
    src = SyntheticClickSource(batch_size=10, num_records=60, rate=300.0)
    t0 = time.monotonic()
    list(src)
    assert time.monotonic() - t0 >= 0.15  # 60 records at 300/s
    parts = [
        ids_of(SyntheticClickSource(batch_size=10, num_records=60, rank=r, world_size=2))
        for r in range(2)
    ]
    assert parts[0][:10] == list(range(10)) and parts[1][:10] == list(range(10, 20))
    assert sorted(parts[0] + parts[1]) == list(range(60))


def test_synthetic_bad_arguments():
    with pytest.raises(ValueError, match="'rate' must be a positive number"):
        SyntheticClickSource(rate=0)
    with pytest.raises(ValueError, match="'batch_size' must be a positive int"):
        SyntheticClickSource(batch_size=0)


# ------------------------------------------------------------------ socket (127.0.0.1 only)
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


# ------------------------------------------------------------------ kafka (fake consumer)
def _record(i: int) -> bytes:
    rec = {"id": i, "label": i % 2, "dense": [1.0] * 13, "cat": [i] * 26}
    return (json.dumps(rec) + "\n").encode()


def _logs() -> dict[int, list[bytes]]:
    logs = {0: [_record(i) for i in range(0, 7)], 1: [_record(i) for i in range(100, 105)]}
    logs[1][2] = b"\xff not json"
    return logs


def test_kafka_source_with_injected_consumer_offsets_and_dead_letters(tmp_path):
    logs = _logs()
    made: list[FakeConsumer] = []

    def factory():
        made.append(FakeConsumer(logs))
        return made[-1]

    dead = tmp_path / "dead.jsonl"
    src = KafkaSource(
        "clicks",
        batch_size=4,
        consumer_factory=factory,
        max_idle_s=0.2,
        poll_timeout_s=0.01,
        dead_letter_path=dead,
    )
    it = iter(src)
    first = next(it)
    state = src.state_dict()
    it.close()
    assert made[0].closed
    assert len(first[1]) == 4
    again = KafkaSource(
        "clicks",
        batch_size=4,
        consumer_factory=factory,
        max_idle_s=0.2,
        poll_timeout_s=0.01,
        dead_letter_path=dead,
    )
    again.load_state_dict(state)
    rest = list(again)
    got = ids_of([first, *rest])
    expected = list(range(7)) + [100, 101, 103, 104]
    assert sorted(got) == expected and len(got) == len(expected)
    assert again.state_dict() == {"offsets": {"clicks:0": 7, "clicks:1": 5}}
    dead_lines = [json.loads(x) for x in dead.read_text().splitlines()]
    assert dead_lines[0]["position"] == {"topic": "clicks", "partition": 1, "offset": 2}


def test_kafka_partitions_are_sharded_by_rank():
    logs = _logs()
    seen = []
    for r in range(2):
        src = KafkaSource(
            "clicks",
            batch_size=4,
            consumer_factory=lambda: FakeConsumer(logs),
            max_idle_s=0.1,
            poll_timeout_s=0.01,
            rank=r,
            world_size=2,
        )
        seen.append(sorted(ids_of(src)))
    assert seen == [list(range(7)), [100, 101, 103, 104]]


def test_kafka_default_factory_names_the_extra_when_kafka_python_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "kafka", None)  # makes `import kafka` fail
    src = KafkaSource("clicks", bootstrap_servers="127.0.0.1:9092")
    with pytest.raises(ImportError, match=r"lit_amp\[kafka\]"):
        next(iter(src))


def test_kafka_bad_arguments():
    with pytest.raises(ValueError, match="either 'consumer_factory' or consumer options"):
        KafkaSource("t", consumer_factory=lambda: None, bootstrap_servers="x")
    with pytest.raises(ValueError, match="'topic' must be a non-empty str"):
        KafkaSource("")
    assert TopicPartition("t", 1).partition == 1


def test_kafka_integration_with_kafka_python():
    """With the [kafka] extra: the default factory builds kafka-python's consumer, configured
    for offsets kept in lit_amp's checkpoint (no auto-commit), without needing a broker."""
    kafka = pytest.importorskip("kafka", reason="the [kafka] extra (kafka-python) is absent")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = KafkaSource("clicks", bootstrap_servers=f"127.0.0.1:{port}", api_version=(2, 0, 0))
    consumer = src.consumer_factory()
    try:
        assert isinstance(consumer, kafka.KafkaConsumer)
        assert consumer.config["enable_auto_commit"] is False
        assert consumer.config["auto_offset_reset"] == "earliest"
        assert src._partition_type() is kafka.TopicPartition
    finally:
        consumer.close()


# ------------------------------------------------------------------ schema
def test_click_schema_json_round_trip():
    cols = SyntheticClickSource(batch_size=5, seed=2).columns(0)
    schema = ClickSchema()
    lines = schema.to_json_lines(cols).splitlines()
    back, index, bad = schema.parse_json_lines(lines)
    assert bad == [] and index.tolist() == list(range(5))
    for k in cols:
        np.testing.assert_array_equal(back[k], cols[k])
