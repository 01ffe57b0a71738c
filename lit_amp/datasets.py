"""Re-export of :mod:`lit_amp.demos.data` (the import path of earlier releases)."""

from lit_amp.demos.data import mnist1d_arrays, mnist1d_loaders

__all__ = ["mnist1d_arrays", "mnist1d_loaders"]
