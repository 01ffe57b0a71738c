"""``RecModel.online_train``'s machinery: its options, its loop and the loop's parts.

=====================  =========================================================================
module                 holds
=====================  =========================================================================
``options``            :class:`StopOptions`, :class:`CheckpointOptions`, :class:`PublishOptions`,
                       :class:`ValidationOptions` (what you pass) and :class:`OnlineSummary`
``loop``               :class:`OnlineLoop`: the callback bridge with ``online_train``'s epochs
``stream``             what Lightning iterates: the user's stream with its cursors
``stopping``           stop conditions and signal handlers
``checkpoints``        cursor checkpoints and resuming from them
``checkpoint_files``   the checkpoint folder: listing, the newest readable one, pruning
``publisher``          published weights on the run's cadence
``validation``         the held-out window (test-then-train) or a fixed validation set
``ranks``              the DDP collectives the loop needs
``guard``              the non-finite guard: a NaN / inf gradient never reaches the parameters
``gc_freeze``          the objects alive at the start, kept out of the collector's passes
=====================  =========================================================================

Example:
    >>> from lit_amp.rec.online import ValidationOptions
    >>> ValidationOptions(valid_every_n_steps=100, valid_window=2).valid_window
    2
"""

from __future__ import annotations

from lit_amp._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "OnlineLoop": "lit_amp.rec.online.loop",
    "OnlineSummary": "lit_amp.rec.online.options",
    "StopOptions": "lit_amp.rec.online.options",
    "CheckpointOptions": "lit_amp.rec.online.options",
    "PublishOptions": "lit_amp.rec.online.options",
    "ValidationOptions": "lit_amp.rec.online.options",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
