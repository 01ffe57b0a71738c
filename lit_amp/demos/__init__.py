"""Demo networks and data for MNIST-1D: what the examples, configs, tests and benchmarks train.

Not part of the training API: only ``lit_amp.cli``, tests, examples and benchmarks import it.

- :mod:`lit_amp.demos.nets` — :class:`MLP`, :class:`CNN1D`, :class:`ResNet1D`
  (+ :class:`BasicBlock1D`).
- :mod:`lit_amp.demos.data` — :func:`synthetic_loaders`, :func:`mnist1d_loaders`,
  :func:`mnist1d_arrays` (offline, seeded).

Example:
    >>> from lit_amp.demos import CNN1D, synthetic_loaders
    >>> train, _ = synthetic_loaders(num_train=32, num_valid=8, batch_size=8)
    >>> x, _ = next(iter(train))
    >>> CNN1D()(x).shape
    torch.Size([8, 10])
"""

from lit_amp.demos.data import mnist1d_arrays, mnist1d_loaders, synthetic_loaders
from lit_amp.demos.nets import CNN1D, MLP, BasicBlock1D, ResNet1D

__all__ = [
    "MLP",
    "CNN1D",
    "BasicBlock1D",
    "ResNet1D",
    "synthetic_loaders",
    "mnist1d_arrays",
    "mnist1d_loaders",
]
