"""Lightning precision plugins, one file per mode (as in ``lightning.pytorch.plugins.precision``).

``AmpPrecision`` (:mod:`.amp`) for any strategy but FSDP; ``AmpFSDPPrecision`` (:mod:`.fsdp`)
for ``FSDPStrategy``. Names are imported lazily (PEP 562).

Example:
    >>> from lit_amp.plugins.precision import AmpFSDPPrecision, AmpPrecision
    >>> AmpPrecision("O0").precision, AmpFSDPPrecision("O0").precision
    ('32-true', '32-true')
"""

from __future__ import annotations

from lit_amp._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "AmpPrecision": "lit_amp.plugins.precision.amp",
    "AmpFSDPPrecision": "lit_amp.plugins.precision.fsdp",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
