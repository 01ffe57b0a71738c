"""Stream sources for :meth:`lit_amp.rec.RecModel.online_train`.

Each source is an iterable of batches with a checkpointable cursor (see
:class:`~lit_amp.rec.sources.base.StreamSource`):

- :class:`DirectorySource` — tails a folder that producers fill by write-then-rename (the
  embedded default; JSON lines, ``.npz`` or ``.pt`` shards).
- :class:`SocketSource` — newline-delimited JSON over TCP.
- :class:`SyntheticClickSource` — a seeded Criteo-like click log at a configurable rate.
- :class:`KafkaSource` — a Kafka topic (the ``[kafka]`` extra, or any injected consumer).

Example:
    >>> from lit_amp.rec.sources import SyntheticClickSource
    >>> features, label = next(iter(SyntheticClickSource(batch_size=8)))
    >>> features["dense"].shape, features["cat"].shape, label.shape
    (torch.Size([8, 13]), torch.Size([8, 26]), torch.Size([8]))
"""

from __future__ import annotations

from lit_amp._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "StreamSource": "lit_amp.rec.sources.base",
    "DeadLetterFile": "lit_amp.rec.sources.base",
    "resolve_shard": "lit_amp.rec.sources.base",
    "ClickSchema": "lit_amp.rec.sources.schema",
    "DirectorySource": "lit_amp.rec.sources.directory",
    "write_shard": "lit_amp.rec.sources.shards",
    "shard_of": "lit_amp.rec.sources.shards",
    "SocketSource": "lit_amp.rec.sources.socket_source",
    "SyntheticClickSource": "lit_amp.rec.sources.synthetic",
    "KafkaSource": "lit_amp.rec.sources.kafka_source",
    "TopicPartition": "lit_amp.rec.sources.kafka_source",
    "kafka_consumer_factory": "lit_amp.rec.sources.kafka_source",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
