"""Re-export of :mod:`lit_amp.plugins.precision.amp` (the import path of earlier releases)."""

from lit_amp.plugins.precision.amp import STATE_KEY, AmpPrecision

__all__ = ["AmpPrecision", "STATE_KEY"]
