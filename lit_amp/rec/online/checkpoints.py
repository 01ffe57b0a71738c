"""Cursor checkpoints of ``online_train`` and resuming from them.

A checkpoint (:class:`CursorCheckpoints`) is one ``online-{step}.ckpt`` file holding the
train-step module's state (network, optimizer, loss scale) and, under ``"online"``, the
stream cursor of every rank and the counters, so they are restored together. Only rank 0
writes; the cursors are gathered first. A source is told that a cursor is durable
(``checkpointed(cursor)``) one checkpoint late: when rank 0 joins the gather of the next
checkpoint it has finished writing the previous one.

At the start of a run, rank 0 removes the temp files a killed writer left in the folder.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from lit_amp._io import remove_stale_temps
from lit_amp.rec._stream import OnlineStream
from lit_amp.rec.online.guard import refuse_nonfinite
from lit_amp.rec.online.options import CheckpointOptions, OnlineSummary
from lit_amp.rec.online.ranks import Ranks
from lit_amp.rec.publish import latest_checkpoint, plain_state, prune_checkpoints
from lit_amp.serialization import save_checkpoint

__all__ = ["CursorCheckpoints"]

log = logging.getLogger(__name__)


class _OnlineState:
    """What a checkpoint holds: the LitModel state plus the ``"online"`` section."""

    def __init__(self, lit: Any, online: dict) -> None:
        self._lit = lit
        self._online = online

    def checkpoint_state(self) -> dict:
        return {**self._lit.checkpoint_state(), "online": self._online}


class CursorCheckpoints:
    """Checkpoints of weights, optimizer, loss scale, stream cursors and counters.

    Args:
        opts: the checkpoint options.
        stream: the run's stream (its source holds the cursor).
        ranks: the DDP ranks.
        cb_params: the run's callback parameters (``cur_step_num``, ``cur_epoch_num``,
            ``latest_ckpt_file``, ``last_save_ckpt_step``).
        summary: the run's summary (``total_records`` in, ``last_checkpoint`` out).
        sink: whether the run is in sink mode (stored in the checkpoint).
    """

    def __init__(
        self,
        opts: CheckpointOptions,
        stream: OnlineStream,
        ranks: Ranks,
        cb_params: Any,
        summary: OnlineSummary,
        *,
        sink: bool,
    ) -> None:
        self.opts = opts
        self.stream = stream
        self.ranks = ranks
        self.cb = cb_params
        self.summary = summary
        self.sink = sink
        self.saved_cursor: Any = None  # this rank's cursor in the newest checkpoint
        self.last_step = -1
        self.last_time = 0.0

    @property
    def directory(self) -> str:
        return os.fspath(self.opts.ckpt_dir)

    def start(self, step: int, t0: float) -> None:
        """Mark ``step`` as covered (nothing new to save yet); rank 0 removes stale temps."""
        self.last_step = step
        self.last_time = t0
        if self.ranks.rank == 0:
            remove_stale_temps(self.directory)

    def time_due(self, now: float) -> bool:
        """Whether ``ckpt_every_n_seconds`` have passed since the last checkpoint."""
        secs = self.opts.ckpt_every_n_seconds
        return secs is not None and now - self.last_time >= secs  # type: ignore[operator]

    def step_due(self, step: int) -> bool:
        """Whether ``step`` is on the ``ckpt_every_n_steps`` cadence."""
        every = self.opts.ckpt_every_n_steps
        return every is not None and step % every == 0

    def save(self, lit: Any, step: int, cursor: Any) -> None:
        """Write ``online-{step}.ckpt`` (a collective under DDP: every rank calls it).

        Raises:
            RuntimeError: a weight is NaN / inf (such a checkpoint is never written).
        """
        refuse_nonfinite(lit, f"the checkpoint of step {step}")
        cursors = self.ranks.gather(cursor)
        # rank 0 finished writing the previous checkpoint before it joined this gather, so
        # what that checkpoint covers is durable on every rank now
        self.release(self.saved_cursor)
        self.saved_cursor = cursor
        self.last_step = step
        self.last_time = time.monotonic()
        if self.ranks.rank != 0:
            return
        online = {
            "step": step,
            "epoch": int(self.cb.cur_epoch_num),
            "records": self.summary.total_records,
            "cursors": plain_state(cursors),  # loadable with torch.load(weights_only=True)
            "world_size": self.ranks.world,
            "sink": self.sink,
            "time": time.time(),
        }
        path = os.path.join(self.directory, f"online-{step:012d}.ckpt")
        save_checkpoint(_OnlineState(lit, online), path, {"step_num": step})
        prune_checkpoints(self.directory, self.opts.keep_checkpoint_max)
        self.summary.last_checkpoint = path
        self.cb.latest_ckpt_file = path
        self.cb.last_save_ckpt_step = step
        log.debug("online_train: checkpoint %s", path)

    def finish(self, lit: Any, step: int, cursor: Any, force: bool = False) -> None:
        """The final checkpoint (if a step is not covered yet, or ``force``: the weights
        changed after the step's checkpoint); release its cursor."""
        if force or step != self.last_step:
            self.save(lit, step, cursor)
        self.ranks.barrier()  # rank 0 has written the final checkpoint
        self.release(self.saved_cursor)

    def release(self, cursor: Any) -> None:
        """Tell the source that a durable checkpoint holds ``cursor`` (it may clean up)."""
        source = self.stream.source
        fn = getattr(source, "checkpointed", None)
        if cursor is None or fn is None:
            return
        try:
            fn(cursor)
        except Exception:  # clean-up must never stop training
            log.warning("online_train: %s.checkpointed failed", type(source).__name__,
                        exc_info=True)

    def restore(self, lit: Any) -> Any:
        """Load the newest checkpoint into ``lit``, the source and the counters.

        Returns:
            This rank's restored cursor, or None (nothing restored, or no cursor).

        Raises:
            RuntimeError: the checkpoint was written by another number of processes and the
                source cannot merge cursors; no checkpoint of ``ckpt_dir`` can be read.
        """
        if not self.opts.resume:
            return None
        found = latest_checkpoint(self.directory)
        if found is None:
            return None
        path, state = found
        lit.load_checkpoint_state(state)
        online = state["online"]
        mine = self._restore_cursor(path, list(online.get("cursors") or []))
        self.cb.cur_step_num = int(online.get("step", 0))
        self.cb.cur_epoch_num = int(online.get("epoch", 0))
        self.summary.total_records = int(online.get("records", 0))
        self.summary.resumed_from = path
        log.info(
            "online_train: resumed from %s (step %d, %d records trained).",
            path,
            int(self.cb.cur_step_num),
            self.summary.total_records,
        )
        return mine

    def _restore_cursor(self, path: str, cursors: list[Any]) -> Any:
        source = self.stream.source
        if source is None or all(c is None for c in cursors):
            return None
        if len(cursors) == self.ranks.world:
            mine = cursors[self.ranks.rank]
        else:
            merge = getattr(type(source), "merge_state_dicts", None)
            if merge is None:
                raise RuntimeError(
                    f"online_train: the checkpoint {path} was written by "
                    f"{len(cursors)} process(es) but this run has {self.ranks.world}, and "
                    f"{type(source).__name__} cannot merge cursors (no merge_state_dicts); "
                    "resume with the same number of processes."
                )
            mine = merge([c for c in cursors if c is not None])
        if mine is not None:
            source.load_state_dict(mine)
            self.saved_cursor = mine
        return mine
