"""Publishing on ``online_train``'s cadence: :class:`Publisher` exports the network for serving.

Rank 0 writes full files (:func:`~lit_amp.rec.serving.writer.publish_weights`) or, with
``PublishOptions(delta=True)``, numbered deltas
(:class:`~lit_amp.rec.serving.writer.DeltaPublisher`: its row tracking hooks the run's optimizers;
with ``background`` it writes in threads). ``publish_hook`` is called for a version once its
file is on disk and ``LATEST`` names it, in publish order (never for a failed write).
At the start of a run, rank 0 removes the temp files a killed writer left. Non-finite
weights are never published.
Under DDP a failed publish is held, and the ranks raise together at the next step end.
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
from lit_amp.rec.serving.writer import DeltaPublisher, publish_weights

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
        self._infos: dict[int, dict] = {}  # version -> hook info, until LATEST names it
        self._publishing: dict | None = None  # the hook info of the publish in progress
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
                background=o.background, on_named=self._named)
            for opt in optimizers:
                self.delta.attach(opt)

    def finish(self, *, quiet: bool = False) -> None:
        """Wait for a full snapshot being written and unhook the optimizers; its failure is
        raised (logged when ``quiet``: the run is already failing)."""
        if self.delta is None:
            return
        try:
            self._hold(self.delta.close)
        except Exception:
            if not quiet:
                raise
            log.exception("online_train: the last version could not be published")
        finally:
            self.delta.detach()

    def poll(self) -> bool:
        """Between steps (rank 0): land what the background writers finished (``LATEST`` and
        ``publish_hook`` name each version now on disk). Raises a failed write's error (in one
        process); under DDP returns whether a failure is held."""
        if self.delta is not None:
            self._hold(self.delta.poll)
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

    def _named(self, version: int, path: str, nbytes: int) -> None:
        """``DeltaPublisher``'s ``on_named``: ``LATEST`` names ``path``, on disk."""
        info = self._infos.pop(version, None)
        if info is None and version == self.delta.version:  # named during its own publish
            info, self._publishing = self._publishing, None
        for v in [v for v in self._infos if v < version]:  # failed: never to be named
            del self._infos[v]
        if info is not None:
            self._announce(path, os.path.basename(path).split("-")[0], nbytes, info)

    def _announce(self, path: str, kind: str, nbytes: int, info: dict) -> None:
        """Record ``path`` as published and call ``publish_hook``: the file is on disk and
        ``LATEST`` names it."""
        self.summary.last_published = path
        log.debug("online_train: published %s", path)
        if self.opts.publish_hook is not None:
            self.opts.publish_hook({"path": path, **info, "published_at": time.time(),
                                    "kind": kind, "bytes": nbytes})

    def time_due(self, now: float) -> bool:
        """Whether ``publish_every_n_seconds`` have passed since the last publish."""
        secs = self.opts.publish_every_n_seconds
        return secs is not None and now - self.last_time >= secs

    def step_due(self, step: int) -> bool:
        """Whether ``step`` is on the ``publish_every_n_steps`` cadence."""
        every = self.opts.publish_every_n_steps
        return every is not None and step % every == 0

    def publish(self, step: int, cursor: Any) -> None:
        """Publish the weights of ``step``; ``publish_hook`` (``cursor`` in its info) is called
        once its file is on disk and ``LATEST`` names it: now, or for a file written in the
        background, by a later :meth:`poll`, publish or :meth:`finish`. Under DDP a failure is
        held (:meth:`_hold`).

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
        info = {"step": step, "records": records, "cursor": cursor}
        if self.delta is None:
            path = publish_weights(self.network, o.publish_dir, step, records=records,
                                   keep=o.keep_published_max)
            self._announce(path, "full", os.path.getsize(path), info)
            return
        self._publishing = info  # for :meth:`_named`, if it names this version now
        try:
            self.delta.publish(step, records=records)
        finally:
            info, self._publishing = self._publishing, None
        if info is not None:  # in the background: named once it is on disk
            self._infos[self.delta.version] = info
