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

from lit_amp.rec.sources.base import DeadLetterFile, StreamSource, resolve_shard
from lit_amp.rec.sources.directory import DirectorySource, shard_of, write_shard
from lit_amp.rec.sources.kafka_source import KafkaSource, TopicPartition, kafka_consumer_factory
from lit_amp.rec.sources.schema import ClickSchema
from lit_amp.rec.sources.socket_source import SocketSource
from lit_amp.rec.sources.synthetic import SyntheticClickSource

__all__ = [
    "StreamSource",
    "DeadLetterFile",
    "resolve_shard",
    "ClickSchema",
    "DirectorySource",
    "write_shard",
    "shard_of",
    "SocketSource",
    "SyntheticClickSource",
    "KafkaSource",
    "TopicPartition",
    "kafka_consumer_factory",
]
