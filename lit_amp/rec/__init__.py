"""Recommendation: ``RecModel.online_train`` on unbounded streams, sources, Wide&Deep.

Example:
    >>> import torch
    >>> from lit_amp.rec import RecModel, StopOptions, WideDeep
    >>> from lit_amp.rec.sources import SyntheticClickSource
    >>> net = WideDeep(vocab_size=50, embed_dim=4, hidden=(8,))
    >>> model = RecModel(net, torch.nn.BCEWithLogitsLoss(), torch.optim.Adam(net.parameters()))
    >>> model.online_train(SyntheticClickSource(batch_size=32),
    ...                    stop=StopOptions(max_steps=3)).total_steps
    3
"""

from lit_amp.rec.metrics import SlidingWindowAUC, binned_auc
from lit_amp.rec.online import (
    CheckpointOptions,
    OnlineSummary,
    PublishOptions,
    StopOptions,
    ValidationOptions,
)
from lit_amp.rec.publish import latest_checkpoint, load_published, publish_weights
from lit_amp.rec.rec_model import RecModel
from lit_amp.rec.wide_deep import LazyAdam, WideDeep

__all__ = [
    "RecModel",
    "OnlineSummary",
    "StopOptions",
    "CheckpointOptions",
    "PublishOptions",
    "ValidationOptions",
    "WideDeep",
    "LazyAdam",
    "SlidingWindowAUC",
    "binned_auc",
    "load_published",
    "publish_weights",
    "latest_checkpoint",
]
