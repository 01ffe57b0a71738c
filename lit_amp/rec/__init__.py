"""Recommendation: ``RecModel.online_train`` on unbounded streams, sources, Wide&Deep.

Names are imported lazily (PEP 562).

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

from __future__ import annotations

from lit_amp._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "RecModel": "lit_amp.rec.rec_model",
    "OnlineSummary": "lit_amp.rec.online.options",
    "StopOptions": "lit_amp.rec.online.options",
    "CheckpointOptions": "lit_amp.rec.online.options",
    "PublishOptions": "lit_amp.rec.online.options",
    "ValidationOptions": "lit_amp.rec.online.options",
    "WideDeep": "lit_amp.rec.modules.wide_deep",
    "LazyAdam": "lit_amp.rec.optim",
    "IdEmbedding": "lit_amp.rec.modules.id_embedding",
    "SlidingWindowAUC": "lit_amp.rec.metrics",
    "binned_auc": "lit_amp.rec.metrics",
    "load_published": "lit_amp.rec.serving.reader",
    "publish_weights": "lit_amp.rec.serving.writer",
    "DeltaPublisher": "lit_amp.rec.serving.writer",
    "latest_checkpoint": "lit_amp.rec.online.checkpoint_files",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
