"""Cursor checkpoints of ``online_train`` and resuming from them.

A checkpoint (:class:`CursorCheckpoints`) is one ``online-{step}.ckpt`` file holding the
train-step module's state and, under ``"online"``, every rank's stream cursor and the
counters, so they are restored together; only rank 0 writes, after gathering the cursors.
With ``CheckpointOptions(background=True)`` the loop only takes a snapshot
(:mod:`lit_amp.rec.state.snapshot`) and a :class:`~lit_amp._io.BackgroundJobs` thread writes
it: one write in flight (a checkpoint due meanwhile waits, counted and logged), a failed write
raised on every rank at the next step end, the final checkpoint written in the loop. A source
hears that a cursor is durable (``checkpointed(cursor)``) one checkpoint late, when rank 0 has
finished the previous write. Folder helpers: :mod:`lit_amp.rec.online.checkpoint_files`.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import os
import time
from typing import Any

from lit_amp._io import BackgroundJobs, remove_stale_temps
from lit_amp.rec.online.checkpoint_files import latest_checkpoint, plain_state, prune_checkpoints
from lit_amp.rec.online.guard import refuse_nonfinite
from lit_amp.rec.online.options import CheckpointOptions, OnlineSummary
from lit_amp.rec.online.ranks import Ranks, raise_held
from lit_amp.rec.online.stream import OnlineStream
from lit_amp.rec.state.snapshot import Snapshot, SnapshotBroken, Snapshots, SnapshotStats
from lit_amp.serialization import checkpoint_payload, save_checkpoint

__all__ = ["CursorCheckpoints"]

log = logging.getLogger(__name__)

#: seconds the end of a run waits for the source's clean-up (the consumed files' deletion)
CLEANUP_WAIT_S = 60.0


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
        self.waits = 0  # checkpoints that waited for the previous write
        self._snapshots: Snapshots | None = None  # rank 0, background writes
        # rank 0: the background write in flight, noted (snapshot, step, stall_s, waited_s);
        # at the ordinary priority: a lower one makes the loop wait for the GIL while the
        # writer, holding it, waits for a CPU (0.1-0.5 s stalls at nice +10)
        self._writes = BackgroundJobs("lit_amp-online-ckpt")
        self._status = "durable"  # rank 0: the newest checkpoint: durable, abandoned, failed
        # rank 0: the file the next row increment follows (None: the next one is whole), and
        # the checkpoints in its chain so far
        self._prev_file: str | None = None
        self._chain = 0
        self._error: BaseException | None = None  # rank 0: why the last write failed

    @property
    def directory(self) -> str:
        return os.fspath(self.opts.ckpt_dir)

    def start(self, step: int, t0: float, optimizers: Any = (), network: Any = None) -> None:
        """Mark ``step`` as covered (nothing new to save yet); rank 0 removes stale temps and,
        with background writes, hooks ``optimizers`` for copy-on-write snapshots."""
        self.last_step = step
        self.last_time = t0
        if self.ranks.rank == 0:
            remove_stale_temps(self.directory)
            if self.opts.background:
                self._snapshots = Snapshots(optimizers, network=network,
                                            track_rows=self.opts.full_every_n_checkpoints > 1)
            # the Trainer's dump_checkpoint imports omegaconf on its first call (0.04-0.13 s):
            # here, not in the first checkpoint's stall
            if importlib.util.find_spec("omegaconf") is not None:
                importlib.import_module("omegaconf")

    def time_due(self, now: float) -> bool:
        """Whether ``ckpt_every_n_seconds`` have passed since the last checkpoint."""
        secs = self.opts.ckpt_every_n_seconds
        return secs is not None and now - self.last_time >= secs

    def step_due(self, step: int) -> bool:
        """Whether ``step`` is on the ``ckpt_every_n_steps`` cadence."""
        every = self.opts.ckpt_every_n_steps
        return every is not None and step % every == 0

    def save(self, lit: Any, step: int, cursor: Any, *, background: bool = True) -> None:
        """Checkpoint step ``step`` as ``online-{step}.ckpt`` (a collective under DDP: every rank
        calls it). With background writes the file is written after this returns.

        Raises:
            RuntimeError: a weight is NaN / inf (such a checkpoint is never written); the
                previous background write failed (its error, on every rank).
            OSError: the previous background write (or this one) failed on a full disk.
        """
        t0 = time.monotonic()
        background = background and self.opts.background  # the same on every rank
        waited = self._wait(due=True)
        if not background:
            refuse_nonfinite(lit, f"the checkpoint of step {step}")
        gathered = self.ranks.gather((cursor, self._status))
        status = gathered[0][1]  # rank 0's word on the previous checkpoint
        if status == "failed":
            self.raise_failure()
        if status == "durable":
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
            "cursors": plain_state([c for c, _ in gathered]),  # loadable with weights_only
            "world_size": self.ranks.world,
            "sink": self.sink,
            "time": time.time(),
        }
        path = os.path.join(self.directory, f"online-{step:012d}.ckpt")
        self._status = "writing"
        if not background:
            self._prev_file = None
            t1 = time.monotonic()
            save_checkpoint(_OnlineState(lit, online), path, {"step_num": step})
            prune_checkpoints(self.directory, self.opts.keep_checkpoint_max)
            stats = SnapshotStats(path, os.path.getsize(path), time.monotonic() - t1)
            self._written(step, stats, time.monotonic() - t0, waited, background=False)
            return
        payload = checkpoint_payload(_OnlineState(lit, online), {"step_num": step})
        follow = self._prev_file is not None and \
            self._chain < self.opts.full_every_n_checkpoints
        snap = self._snapshots.take(
            payload, prev=os.path.basename(self._prev_file) if follow else None)
        if snap.increment:
            path = os.path.join(self.directory, f"online-{step:012d}-rows.ckpt")
        self._chain = self._chain + 1 if snap.increment else 1
        self._prev_file = path
        self._writes.submit(self._write, snap, path,
                            note=(snap, step, time.monotonic() - t0, waited))

    def _write(self, snap: Snapshot, path: str) -> SnapshotStats:
        """The background thread: write ``snap`` to ``path``, then prune old checkpoints."""
        stats = snap.write(path)
        prune_checkpoints(self.directory, self.opts.keep_checkpoint_max)
        return stats

    def poll(self) -> bool:
        """Collect a finished background write (rank 0); whether a write failed."""
        if self._writes.pending is not None and self._writes.pending[0].done():
            self._wait()
        return self._error is not None

    def _wait(self, due: bool = False) -> float:
        """Wait for the write in flight and collect it (its error is kept, not raised);
        returns the seconds waited. ``due``: a checkpoint is due (a wait is counted)."""
        if self._writes.pending is None:
            return 0.0
        t0 = time.monotonic()
        busy = self._writes.busy()
        self.waits += int(due and busy)
        write, (snap, step, stall, waited0) = self._writes.take(wait=True)
        try:
            stats = write.result()
        except SnapshotBroken as exc:
            self._status, self._prev_file = "abandoned", None
            self._snapshots.broken(snap)
            log.warning("%s Its parameters are copied whole in the next checkpoints; the next "
                        "checkpoint is the next one due (or the final one).", exc)
            return time.monotonic() - t0
        except BaseException as exc:  # raised in the training loop by raise_failure
            self._status, self._error, self._prev_file = "failed", exc, None
            return time.monotonic() - t0
        waited = time.monotonic() - t0
        if due and busy and (self.waits <= 3 or self.waits % 100 == 0):
            log.warning(
                "online_train: the checkpoint due now waited %.2f s for the previous one (step "
                "%d) to be written (%d such waits): checkpoints are due more often than they "
                "can be written; raise ckpt_every_n_steps / ckpt_every_n_seconds.",
                waited, step, self.waits)
        self._written(step, stats, stall, waited0, background=True)
        return waited

    def _written(self, step: int, stats: SnapshotStats, stall: float, waited: float, *,
                 background: bool) -> None:
        """Rank 0: the checkpoint of ``step`` is durable (``stall``: seconds the loop was
        blocked by it, ``waited`` of them for the previous write)."""
        self._status = "durable"
        self.summary.last_checkpoint = stats.path
        self.cb.latest_ckpt_file = stats.path
        self.cb.last_save_ckpt_step = step
        figures = {"step": step, "stall_s": stall, "waited_s": waited, "background": background,
                   **dataclasses.asdict(stats)}
        log.debug("online_train: checkpoint %s (%.1f MB; the loop was blocked %.1f ms, the "
                  "write took %.2f s)", stats.path, stats.bytes / 2**20, 1e3 * stall,
                  stats.write_s, extra={"lit_amp_checkpoint": figures})

    def raise_failure(self) -> None:
        """Raise the failure of rank 0's last background write (its own error on rank 0)."""
        err, self._error = self._error, None
        raise_held(err, "online_train: rank 0 failed to write a checkpoint (its log says why); "
                        "every rank stops.")

    def finish(self, lit: Any, step: int, cursor: Any, force: bool = False) -> None:
        """The final checkpoint (if a step is not covered yet, or ``force``: the weights
        changed after the step's checkpoint), written in the loop; release its cursor."""
        try:
            self._wait()
            mine = self.ranks.rank == 0
            failed, redo = self.ranks.reduce_max(
                [int(mine and self._status == "failed"),
                 int(mine and self._status == "abandoned")])
            if failed:
                self.raise_failure()
            if force or redo or step != self.last_step:
                self.save(lit, step, cursor, background=False)
            self.ranks.barrier()  # rank 0 has written the final checkpoint
            self.release(self.saved_cursor, wait=True)
        finally:
            self.close(quiet=True)

    def close(self, *, quiet: bool = False) -> None:
        """Wait for the write in flight (an error is logged when ``quiet``, else raised) and
        unhook the optimizers (the end of the run, or an exception)."""
        try:
            self._wait()
            if self._error is not None and not quiet:
                self.raise_failure()
            if self._error is not None:
                log.error("online_train: writing a checkpoint failed: %s", self._error)
                self._error = None
        finally:
            if self._snapshots is not None:
                self._snapshots.remove()
                self._snapshots = None
            self._writes.close()  # the write in flight was taken: nothing left to raise

    def release(self, cursor: Any, *, wait: bool = False) -> None:
        """Tell the source that a durable checkpoint holds ``cursor`` (it may clean up);
        ``wait``: and wait for that clean-up (the end of a run)."""
        source = self.stream.source
        fn = getattr(source, "checkpointed", None)
        if cursor is None or fn is None:
            return
        try:
            fn(cursor)
            settle = getattr(source, "wait_cleanup", None)
            if wait and settle is not None and not settle(CLEANUP_WAIT_S):
                log.warning("online_train: %s is still cleaning up after %.0f s; what is left "
                            "is cleaned up after the next run's first checkpoint.",
                            type(source).__name__, CLEANUP_WAIT_S)
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
