"""Lightning precision plugins, one file per mode (as in ``lightning.pytorch.plugins.precision``).

* :mod:`~lit_amp.plugins.precision.amp` - :class:`AmpPrecision`: MindSpore's AMP levels and
  loss scaling for any strategy but FSDP.
* :mod:`~lit_amp.plugins.precision.fsdp` - :class:`AmpFSDPPrecision`: the same for
  ``FSDPStrategy`` (which accepts only ``FSDPPrecision`` subclasses).

Example:
    >>> AmpPrecision("O0").precision, AmpFSDPPrecision("O0").precision
    ('32-true', '32-true')
"""

from lit_amp.plugins.precision.amp import AmpPrecision
from lit_amp.plugins.precision.fsdp import AmpFSDPPrecision

__all__ = ["AmpPrecision", "AmpFSDPPrecision"]
