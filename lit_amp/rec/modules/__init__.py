"""Recommender networks and tables: :class:`WideDeep` (the example net), :class:`IdEmbedding`."""

from __future__ import annotations

from lit_amp._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "WideDeep": "lit_amp.rec.modules.wide_deep",
    "IdEmbedding": "lit_amp.rec.modules.id_embedding",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
