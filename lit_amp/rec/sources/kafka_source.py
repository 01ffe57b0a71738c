"""``KafkaSource``: JSON records from a Kafka topic (the ``[kafka]`` extra: kafka-python).

The consumer is built by a factory, so tests (and other clients) can inject any object with
kafka-python's consumer methods: ``partitions_for_topic(topic)``, ``assign(partitions)``,
``seek(partition, offset)``, ``poll(timeout_ms=, max_records=)`` returning
``{partition: [record, ...]}`` (records with ``.partition``, ``.offset``, ``.value``), and
``close()``.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from lit_amp.rec.sources.base import StreamSource, check_source_args, resolve_shard
from lit_amp.rec.sources.schema import ClickSchema

__all__ = ["KafkaSource", "TopicPartition", "kafka_consumer_factory"]

log = logging.getLogger(__name__)


class TopicPartition(NamedTuple):
    """``(topic, partition)``, the same shape as kafka-python's ``TopicPartition``.

    Example:
        >>> TopicPartition("clicks", 3).partition
        3
    """

    topic: str
    partition: int


def _import_kafka() -> Any:
    try:
        import kafka  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError(
            "KafkaSource's default consumer needs kafka-python, which is not installed: install "
            "the extra with `pip install 'lit_amp[kafka]'`, or pass consumer_factory=... to use "
            "another client."
        ) from exc
    return kafka


def kafka_consumer_factory(**config: Any) -> Callable[[], Any]:
    """A factory of kafka-python ``KafkaConsumer`` objects (manual assignment, no auto-commit).

    Args:
        **config: ``KafkaConsumer`` options, e.g. ``bootstrap_servers="host:9092"``.

    Raises:
        ImportError: (when the factory is called) kafka-python is missing: the ``[kafka]`` extra.

    Example:
        >>> make = kafka_consumer_factory(bootstrap_servers="127.0.0.1:9092")
        >>> callable(make)
        True
    """

    def make() -> Any:
        kafka = _import_kafka()
        opts = {"enable_auto_commit": False, "auto_offset_reset": "earliest", **config}
        return kafka.KafkaConsumer(**opts)

    return make


class KafkaSource(StreamSource):
    """Read JSON records from a Kafka topic's partitions, as batches, with offsets as cursor.

    Partitions are assigned manually (no consumer group), partition ``p`` to shard
    ``p % num_shards`` (ranks x DataLoader workers), so the cursor — the next offset of every
    partition, as of the last batch yielded — lives in lit_amp's checkpoint, and a restart
    seeks there (at-least-once). Partitions without a stored offset start where the consumer's
    ``auto_offset_reset`` says. Malformed values — a tombstone (value ``None``) included — go
    to the dead-letter file (or the log) with ``{"topic", "partition", "offset"}``.

    A topic has no end: the stream ends after ``max_idle_s`` spent *waiting* for records (in
    polls that returned none; neither parsing records nor the consumer's training on a batch
    counts), ``end_reason`` ``"idle_timeout"``,
    or when the idle hook asks to stop (``"stopped"``).

    Args:
        topic: the topic.
        batch_size: records per batch.
        consumer_factory: a no-argument callable returning a consumer (default: kafka-python's
            ``KafkaConsumer(**consumer_config)``, which needs the ``[kafka]`` extra).
        schema: the record schema (default :class:`ClickSchema`).
        poll_timeout_s: how long one ``poll`` waits.
        max_idle_s: end the stream after this long without a record (None: never).
        linger_s: while waiting, yield a partial batch once its first record waited this long.
        dead_letter_path: where malformed records go (None: the log).
        rank, world_size: shard explicitly (default: from ``torch.distributed``).
        **consumer_config: options of the default consumer (``bootstrap_servers``, ...).

    Raises:
        ValueError: bad sizes or intervals; both a factory and consumer options.
        ImportError: (when iterating) the default factory without kafka-python.

    Example:
        >>> src = KafkaSource("clicks", batch_size=100, consumer_factory=lambda: None)
        >>> src.state_dict()
        {'offsets': {}}
    """

    def __init__(
        self,
        topic: str,
        batch_size: int = 1000,
        *,
        consumer_factory: Callable[[], Any] | None = None,
        schema: Any = None,
        poll_timeout_s: float = 0.1,
        max_idle_s: float | None = None,
        linger_s: float | None = None,
        dead_letter_path: str | os.PathLike | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        **consumer_config: Any,
    ) -> None:
        super().__init__(dead_letter_path=dead_letter_path, name="KafkaSource")
        owner = "KafkaSource"
        if not isinstance(topic, str) or not topic:
            raise ValueError(
                f"For '{owner}', the argument 'topic' must be a non-empty str, but got {topic!r}."
            )
        check_source_args(
            owner,
            batch_size,
            (
                ("poll_timeout_s", poll_timeout_s, False),
                ("max_idle_s", max_idle_s, True),
                ("linger_s", linger_s, True),
            ),
        )
        if consumer_factory is not None and consumer_config:
            raise ValueError(
                f"For '{owner}', pass either 'consumer_factory' or consumer options "
                f"{sorted(consumer_config)}, not both."
            )
        if consumer_factory is not None and not callable(consumer_factory):
            raise ValueError(
                f"For '{owner}', the argument 'consumer_factory' must be callable, but got "
                f"{consumer_factory!r}."
            )
        self.topic = topic
        self.batch_size = batch_size
        self.consumer_factory = consumer_factory or kafka_consumer_factory(**consumer_config)
        self.schema = schema if schema is not None else ClickSchema()
        self.poll_timeout_s = float(poll_timeout_s)
        self.max_idle_s = max_idle_s
        self.linger_s = linger_s
        self.rank, self.world_size = rank, world_size
        self._cursor = {"offsets": {}}

    def state_dict(self) -> dict[str, Any]:
        """``{"offsets": {"topic:partition": next offset}}``."""
        return {"offsets": dict(self._cursor["offsets"])}

    def _restore(self, state: dict[str, Any]) -> None:
        offsets = state.get("offsets")
        if not isinstance(offsets, dict):
            raise ValueError(
                "For 'KafkaSource.load_state_dict', the state must be {'offsets': {'topic:p': "
                f"offset}}, but got {state!r}."
            )
        self._cursor = {"offsets": {str(k): int(v) for k, v in offsets.items()}}

    @staticmethod
    def merge_state_dicts(states: list[dict[str, Any]]) -> dict[str, Any]:
        """One cursor from several readers' cursors (partitions are disjoint between readers)."""
        out: dict[str, int] = {}
        for s in states:
            for k, v in s.get("offsets", {}).items():
                out[k] = max(out.get(k, 0), int(v))
        return {"offsets": out}

    def _partition_type(self) -> Any:
        try:
            import kafka  # noqa: PLC0415

            return kafka.TopicPartition
        except ImportError:
            return TopicPartition

    def __iter__(self) -> Iterator[Any]:
        shard, nshards = resolve_shard(self.rank, self.world_size)
        self.end_reason = None
        consumer = self.consumer_factory()
        try:
            tp_type = self._partition_type()
            parts = sorted(consumer.partitions_for_topic(self.topic) or ())
            mine = [tp_type(self.topic, p) for p in parts if p % nshards == shard]
            consumer.assign(mine)
            offsets: dict[str, int] = dict(self._cursor["offsets"])
            for tp in mine:
                key = f"{tp.topic}:{tp.partition}"
                if key in offsets:
                    consumer.seek(tp, offsets[key])
            rows: list[tuple] = []
            first_at = 0.0
            waited = 0.0  # seconds of empty polls since the last record: the idle clock
            inbox: deque[Any] = deque()
            while True:
                while inbox and len(rows) < self.batch_size:
                    rec = inbox.popleft()
                    key = f"{self.topic}:{rec.partition}"
                    offsets[key] = rec.offset + 1
                    row = self._parse_record(
                        self.schema,
                        rec.value,
                        {"topic": self.topic, "partition": rec.partition, "offset": rec.offset},
                    )
                    if row is None:
                        continue
                    if not rows:
                        first_at = time.monotonic()
                    rows.append(row)
                now = time.monotonic()
                if len(rows) >= self.batch_size or (
                    rows
                    and not inbox
                    and self.linger_s is not None
                    and now - first_at >= self.linger_s
                ):
                    yield self._emit(rows, offsets)  # training on it is not idle time
                    rows = []
                    continue
                if inbox:
                    continue
                # only waiting counts: parsing a slow poll's records never ends the pass
                # while the broker has more
                if self.max_idle_s is not None and waited >= self.max_idle_s:
                    self.end_reason = "idle_timeout"
                    if rows:
                        yield self._emit(rows, offsets)
                    return
                t_poll = time.monotonic()
                polled = consumer.poll(
                    timeout_ms=int(self.poll_timeout_s * 1000), max_records=self.batch_size
                )
                got = False
                for _tp, records in sorted((polled or {}).items(), key=lambda kv: kv[0][1]):
                    inbox.extend(records)
                    got = got or bool(records)
                if got:
                    waited = 0.0
                    continue
                waited += time.monotonic() - t_poll
                if self._idle():
                    self.end_reason = "stopped"
                    return
        finally:
            close = getattr(consumer, "close", None)
            if close is not None:
                close()

    def _emit(self, rows: list[tuple], offsets: dict[str, int]) -> Any:
        self._cursor = {"offsets": dict(offsets)}
        self.records_read += len(rows)
        self.batches_read += 1
        return self.schema.to_batch(self.schema.rows_to_columns(rows))
