"""``Model`` (the MindSpore facade) and ``LitModel`` (the LightningModule adapter).

Names are imported lazily (PEP 562).

Example:
    >>> from lit_amp.model import LitModel, Model
"""

from __future__ import annotations

from lit_amp._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "Model": "lit_amp.model.model",
    "LitModel": "lit_amp.model.lit_model",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
