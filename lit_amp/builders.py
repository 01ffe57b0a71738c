"""Re-export of :mod:`lit_amp.demos` (the import path of earlier releases)."""

from lit_amp.demos import BasicBlock1D, ResNet1D, synthetic_loaders

__all__ = ["synthetic_loaders", "ResNet1D", "BasicBlock1D"]
