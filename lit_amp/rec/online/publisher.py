"""Publishing on ``online_train``'s cadence: :class:`Publisher` exports the network for serving.

Rank 0 writes, full snapshots (:func:`~lit_amp.rec.publish.publish_weights`) or, with
``PublishOptions(delta=True)``, numbered deltas (:class:`~lit_amp.rec.publish.DeltaPublisher`,
whose row tracking hooks the run's optimizers; with ``background``, deltas are written by a
thread and ``publish_hook`` names one once it is on disk); the files and their reader are in
:mod:`lit_amp.rec.publish`. At the start of a run, rank 0 removes the temp files a killed
writer left in the folder. Non-finite weights are never published. Under DDP a failed publish
is held, and the ranks raise together at the next step end (as checkpoints' failures do).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch

from lit_amp._io import remove_stale_temps
from lit_amp.rec.online.guard import refuse_nonfinite
from lit_amp.rec.online.options import OnlineSummary, PublishOptions
from lit_amp.rec.online.ranks import Ranks, raise_held
from lit_amp.rec.publish import DeltaPublisher, publish_weights

__all__ = ["Publisher"]

log = logging.getLogger(__name__)


class Publisher:
    """Exports the network's weights for serving on ``PublishOptions``' cadence (rank 0 writes).

    Args:
        opts: the publish options.
        network: the backbone (published weights are its ``state_dict``).
        ranks: the DDP ranks.
        summary: the run's summary (``total_records`` in, ``last_published`` out).
    """

    def __init__(
        self, opts: PublishOptions, network: torch.nn.Module, ranks: Ranks, summary: OnlineSummary
    ) -> None:
        self.opts = opts
        self.network = network
        self.ranks = ranks
        self.summary = summary
        self.last_step = -1
        self.last_time = 0.0
        self.delta: DeltaPublisher | None = None  # rank 0 with ``delta``: the version writer
        self._later: dict[int, dict] = {}  # version -> hook info of a delta being written
        self._error: Exception | None = None  # under DDP: a failure held for the step end

    def start(self, step: int, t0: float, optimizers: Any = ()) -> None:
        """Mark ``step`` as published (nothing new yet); rank 0 removes stale temps and, with
        ``delta``, tracks the rows ``optimizers`` change from now on."""
        self.last_step = step
        self.last_time = t0
        if self.ranks.rank != 0:
            return
        o = self.opts
        remove_stale_temps(os.fspath(o.publish_dir))
        if o.delta:
            self.delta = DeltaPublisher(
                self.network, o.publish_dir, full_every_n_publishes=o.full_every_n_publishes,
                max_delta_fraction=o.max_delta_fraction, keep_full_max=o.keep_published_max,
                background=o.background)
            for opt in optimizers:
                self.delta.attach(opt)

    def finish(self, *, quiet: bool = False) -> None:
        """Wait for a full snapshot being written and unhook the optimizers; its failure is
        raised (logged when ``quiet``: the run is already failing)."""
        if self.delta is None:
            return
        try:
            self._hold(self.delta.close)
            self._announce_landed()
        except Exception:
            if not quiet:
                raise
            log.exception("online_train: the last version could not be published")
        finally:
            self.delta.detach()

    def poll(self) -> bool:
        """Between steps (rank 0): land what the background writers finished and call
        ``publish_hook`` for the deltas now on disk. Raises a failed write's error (in one
        process); under DDP returns whether a failure is held."""
        if self.delta is not None:
            self._hold(self.delta.poll)
            self._announce_landed()
        return self._error is not None

    def _hold(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``; in one process its error is raised, under DDP it is held (logged) for
        the ranks to raise together (:meth:`raise_failure`): a rank raising alone would leave
        the others waiting in their next collective."""
        try:
            return fn(*args)
        except Exception as exc:
            if self.ranks.world == 1:
                raise
            log.error("online_train: rank %d failed to publish (every rank stops at the next "
                      "step end): %r", self.ranks.rank, exc)
            if self._error is None:
                self._error = exc
            return None

    def raise_failure(self) -> None:
        """Raise the held failure (this rank's own error, or one saying another rank failed)."""
        err, self._error = self._error, None
        raise_held(err, "online_train: another rank failed to publish (its log says why); every "
                        "rank stops.")

    def settle(self) -> None:
        """At the end of a run under DDP: every rank raises if one holds a failed publish."""
        if self.ranks.reduce_max([int(self._error is not None)])[0]:
            self.raise_failure()

    def _announce_landed(self) -> None:
        landed = list(self.delta.landed)
        self.delta.landed.clear()
        for version, _path, nbytes in landed:
            info = self._later.pop(version, None)
            if info is not None and self.opts.publish_hook is not None:
                self.opts.publish_hook({**info, "published_at": time.time(), "bytes": nbytes})

    def time_due(self, now: float) -> bool:
        """Whether ``publish_every_n_seconds`` have passed since the last publish."""
        secs = self.opts.publish_every_n_seconds
        return secs is not None and now - self.last_time >= secs

    def step_due(self, step: int) -> bool:
        """Whether ``step`` is on the ``publish_every_n_steps`` cadence."""
        every = self.opts.publish_every_n_steps
        return every is not None and step % every == 0

    def publish(self, step: int, cursor: Any) -> None:
        """Publish the weights of ``step``; then call ``publish_hook`` (``cursor`` in its info).
        Under DDP a failure is held (:meth:`_hold`).

        Raises:
            RuntimeError: a weight is NaN / inf (non-finite weights are never published).
        """
        self._hold(self._publish, step, cursor)

    def _publish(self, step: int, cursor: Any) -> None:
        if self.delta is None:  # a delta checks the values it writes (rank 0 only)
            refuse_nonfinite(self.network, f"the weights of step {step}")
        self.last_step = step
        self.last_time = time.monotonic()
        if self.ranks.rank != 0:
            return
        o = self.opts
        records = self.summary.total_records
        if self.delta is not None:
            path = self.delta.publish(step, records=records)
            self._announce_landed()  # the previous version, landed before this one started
            kind, nbytes = self.delta.last_kind, self.delta.last_bytes
            if self.delta.writing(self.delta.version):
                self.summary.last_published = path
                self._later[self.delta.version] = {
                    "path": path, "step": step, "records": records, "cursor": cursor,
                    "kind": kind}
                return
        else:
            path = publish_weights(self.network, o.publish_dir, step, records=records,
                                   keep=o.keep_published_max)
            kind, nbytes = "full", os.path.getsize(path)
        self.summary.last_published = path
        log.debug("online_train: published %s", path)
        if o.publish_hook is not None:
            o.publish_hook({
                "path": path, "step": step, "records": records, "published_at": time.time(),
                "cursor": cursor, "kind": kind, "bytes": nbytes,
            })
