"""``AmpFSDPPrecision``: :class:`~lit_amp.plugins.precision.amp.AmpPrecision` for FSDP.

Lightning's ``FSDPStrategy`` accepts only ``FSDPPrecision`` subclasses, so this twin subclasses
it and shares AmpPrecision's implementation. The O-level casting is done by lit_amp's module
hooks (installed in ``convert_module``, before FSDP wraps the model), not by torch FSDP's
``MixedPrecision``: FSDP keeps float32 parameters, shards and reduces gradients in float32, and
each converted module casts the unsharded parameters to the low dtype at use - MindSpore's
"float32 storage, 16-bit compute, BatchNorm/LayerNorm in float32 at O2" semantics, which FSDP's
own ``MixedPrecision`` cannot express (it casts LayerNorm too). Low-precision parameter copies
are not cached under FSDP (the unsharded storage changes between forwards).

Example:
    >>> import torch
    >>> plugin = AmpFSDPPrecision("O2", dtype=torch.bfloat16)
    >>> plugin.precision, plugin.mixed_precision_config is None
    ('bf16-mixed', True)
"""

from __future__ import annotations

import contextlib
from typing import Any

from lightning.pytorch.plugins.precision import FSDPPrecision

from lit_amp.plugins.precision.amp import _AmpPrecisionMixin

__all__ = ["AmpFSDPPrecision"]


class AmpFSDPPrecision(_AmpPrecisionMixin, FSDPPrecision):
    """MindSpore's AMP levels and loss scaling for ``FSDPStrategy``.

    Takes the same arguments as :class:`~lit_amp.plugins.precision.amp.AmpPrecision`
    (``level``, ``dtype``, ``amp``, ``loss_scale`` and its ``**options``); ``cache_casts``
    defaults to False. Gradient clipping by norm is not supported (as in
    Lightning's ``FSDPPrecision``); clip by value, or inside the model.

    Example:
        >>> AmpFSDPPrecision("O0").precision
        '32-true'
    """

    _cache_casts_default = False

    def __init__(self, level: str = "O2", **kwargs: Any) -> None:
        FSDPPrecision.__init__(self, "32-true")
        self._amp_init(level, **kwargs)
        self.scaler = None  # loss scaling is lit_amp's controller, not a ShardedGradScaler

    @property
    def mixed_precision_config(self) -> None:
        """None: FSDP keeps float32 parameters; lit_amp's hooks cast at use."""
        return None

    def convert_output(self, data: Any) -> Any:
        return data

    def forward_context(self) -> contextlib.AbstractContextManager:
        return _AmpPrecisionMixin.forward_context(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(level={self.level!r}, precision={self.precision!r})"
