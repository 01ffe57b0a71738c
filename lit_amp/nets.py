"""Re-export of :mod:`lit_amp.demos.nets` (the import path of earlier releases)."""

from lit_amp.demos.nets import CNN1D, MLP

__all__ = ["MLP", "CNN1D"]
