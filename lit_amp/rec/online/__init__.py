"""``RecModel.online_train``'s machinery: its options, its loop and the loop's parts.

=================  ===========================================================================
module             holds
=================  ===========================================================================
``options``        :class:`StopOptions`, :class:`CheckpointOptions`, :class:`PublishOptions`,
                   :class:`ValidationOptions` (what you pass) and :class:`OnlineSummary`
``loop``           :class:`OnlineLoop`: the callback bridge with ``online_train``'s epochs
``stopping``       stop conditions and signal handlers
``checkpoints``    cursor checkpoints and resuming from them
``publisher``      published weights on the run's cadence
``validation``     the held-out window (test-then-train) or a fixed validation set
``ranks``          the DDP collectives the loop needs
``guard``          the non-finite guard: a NaN / inf gradient never reaches the parameters
=================  ===========================================================================

Example:
    >>> ValidationOptions(valid_every_n_steps=100, valid_window=2).valid_window
    2
"""

from lit_amp.rec.online.loop import OnlineLoop
from lit_amp.rec.online.options import (
    CheckpointOptions,
    OnlineSummary,
    PublishOptions,
    StopOptions,
    ValidationOptions,
)

__all__ = [
    "OnlineLoop",
    "OnlineSummary",
    "StopOptions",
    "CheckpointOptions",
    "PublishOptions",
    "ValidationOptions",
]
