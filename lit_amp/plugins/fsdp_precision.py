"""Re-export of :mod:`lit_amp.plugins.precision.fsdp` (the import path of earlier releases)."""

from lit_amp.plugins.precision.fsdp import AmpFSDPPrecision

__all__ = ["AmpFSDPPrecision"]
