"""Weights for serving: written by the trainer, read by a server (layouts in ``format``).

=====================  =====================================================================
module                 holds
=====================  =====================================================================
``format``             file names, formats and checksums (shared by writer and reader)
``writer``             :func:`publish_weights` and :class:`DeltaPublisher`
``full_snapshots``     a delta publisher's full snapshots, written in a thread
``reader``             :func:`load_published`, :func:`latest_published`
=====================  =====================================================================
"""

from __future__ import annotations

from lit_amp._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "publish_weights": "lit_amp.rec.serving.writer",
    "DeltaPublisher": "lit_amp.rec.serving.writer",
    "load_published": "lit_amp.rec.serving.reader",
    "latest_published": "lit_amp.rec.serving.reader",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
