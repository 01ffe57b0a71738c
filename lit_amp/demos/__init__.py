"""Demo networks and data for MNIST-1D: what the examples, configs, tests and benchmarks train.

Not part of the training API: only ``lit_amp.cli``, tests, examples and benchmarks import it.

Example:
    >>> from lit_amp.demos import CNN1D, synthetic_loaders
    >>> train, _ = synthetic_loaders(num_train=32, num_valid=8, batch_size=8)
    >>> x, _ = next(iter(train))
    >>> CNN1D()(x).shape
    torch.Size([8, 10])
"""

from __future__ import annotations

from lit_amp._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "MLP": "lit_amp.demos.nets",
    "CNN1D": "lit_amp.demos.nets",
    "BasicBlock1D": "lit_amp.demos.nets",
    "ResNet1D": "lit_amp.demos.nets",
    "synthetic_loaders": "lit_amp.demos.data",
    "mnist1d_arrays": "lit_amp.demos.data",
    "mnist1d_loaders": "lit_amp.demos.data",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
