"""What is particular to ``KafkaSource`` (``lit_amp.rec.sources.kafka_source``), with a fake
consumer: offsets and dead letters, partitions sharded by rank, the missing extra, argument
checks, kafka-python's consumer when installed. What every source must do is in
test_contract.py."""

from __future__ import annotations

import json
import socket
import sys

import pytest

from lit_amp.rec.sources import KafkaSource, TopicPartition
from tests.rec.sources.contract import FakeConsumer, ids_of


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
