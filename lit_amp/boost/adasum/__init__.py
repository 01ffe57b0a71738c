"""AdaSum: combine the data-parallel ranks' weight updates adaptively, in four layers.

* :mod:`~lit_amp.boost.adasum.maths` - the combination and its tree, no communication
  (:func:`adasum_combine`, :func:`adasum_reduce`).
* :mod:`~lit_amp.boost.adasum.transport` - how the deltas travel: an all-gather, or recursive
  vector halving through point-to-point sends (:func:`adasum_allreduce_`);
  :mod:`~lit_amp.boost.adasum.shm` is the shared-memory all-gather for ranks on one host.
* :mod:`~lit_amp.boost.adasum.hooks` - the DDP communication hooks and the optimizer step
  hooks that apply it to a training step (:class:`AdaSumHooks`, pure torch).
* :mod:`~lit_amp.boost.adasum.callback` - :class:`AdaSum`, the Lightning callback.

Names are imported lazily (PEP 562).

Example:
    >>> import torch
    >>> from lit_amp.boost.adasum import adasum_combine
    >>> adasum_combine(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))
    tensor([1., 1.])
"""

from __future__ import annotations

from lit_amp._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "AdaSum": "lit_amp.boost.adasum.callback",
    "AdaSumHooks": "lit_amp.boost.adasum.hooks",
    "noop_comm_hook": "lit_amp.boost.adasum.hooks",
    "local_mean_comm_hook": "lit_amp.boost.adasum.hooks",
    "EPS": "lit_amp.boost.adasum.maths",
    "adasum_combine": "lit_amp.boost.adasum.maths",
    "adasum_reduce": "lit_amp.boost.adasum.maths",
    "adasum_allreduce_": "lit_amp.boost.adasum.transport",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
