"""The objects alive when the online loop starts, kept out of the cyclic collector's passes.

A process that has imported Lightning and torch holds about 400,000 objects; a full pass of
the collector walks them all (0.16 s on a 2-core machine), stalling a step or a checkpoint's
snapshot wherever it falls. :func:`freeze` collects once and moves what is left to the
permanent generation, which no pass walks (``gc.freeze``); :func:`unfreeze` hands it back when
the loop ends. A process that froze objects itself (a server that freezes before it forks)
keeps its own freeze: then nothing is done either way.
"""

from __future__ import annotations

import gc

__all__ = ["freeze", "unfreeze"]


def freeze() -> bool:
    """Collect, then freeze every object alive; False (nothing done) where objects are frozen
    already."""
    if gc.get_freeze_count():
        return False
    gc.collect()
    gc.freeze()
    return True


def unfreeze(frozen: bool) -> None:
    """Undo :func:`freeze` (``frozen``: what it returned)."""
    if frozen:
        gc.unfreeze()
