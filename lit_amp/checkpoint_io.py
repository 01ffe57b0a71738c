"""Re-export of :mod:`lit_amp._io`'s checkpoint functions (the import path of earlier releases).

The files are Lightning checkpoints plus lit_amp's keys (one format; see :mod:`lit_amp._io`).

Example:
    >>> from lit_amp.checkpoint_io import save_checkpoint, load_checkpoint
"""

from lit_amp._io import (  # noqa: F401
    CHECKPOINT_FORMAT,
    load_checkpoint,
    load_param_into_net,
    save_checkpoint,
)

__all__ = ["CHECKPOINT_FORMAT", "load_checkpoint", "load_param_into_net", "save_checkpoint"]
