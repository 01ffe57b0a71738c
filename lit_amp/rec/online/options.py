"""What ``RecModel.online_train`` takes and returns: four option groups and the summary.

Each option group is a frozen dataclass whose fields are checked when it is built (types,
ranges; NaN and infinity refused), so a mistake is reported where it is written, with the
field's name, as MindSpore does: a wrong type is a ``TypeError``, a wrong value a
``ValueError``. Leaving a group out (``None``) turns that feature off, except
:class:`StopOptions`, whose defaults (stop on SIGTERM / SIGINT) apply when it is left out.

Example:
    >>> StopOptions(max_steps=100, max_time=60).max_time
    60.0
    >>> CheckpointOptions("/tmp/ckpt", ckpt_every_n_seconds=float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: For 'CheckpointOptions', the argument 'ckpt_every_n_seconds' must be a finite number > 0.0 or None, but got nan.
"""  # noqa: E501

from __future__ import annotations

import dataclasses
import datetime
import os
import signal
from collections.abc import Callable, Iterable
from typing import Any

from lit_amp._validation import (
    check_bool,
    check_int,
    check_number,
    check_positive_int,
    type_error,
    value_error,
)

__all__ = [
    "StopOptions",
    "CheckpointOptions",
    "PublishOptions",
    "ValidationOptions",
    "OnlineSummary",
]

_UNCATCHABLE = {getattr(signal, n) for n in ("SIGKILL", "SIGSTOP") if hasattr(signal, n)}


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # normalising a field of a frozen dataclass


def _seconds(owner: str, name: str, value: Any) -> float | None:
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    return check_number(owner, name, value, minimum=0.0, strict=True, allow_none=True)


def _dir(owner: str, name: str, value: Any, *, allow_none: bool = False) -> str | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise type_error(owner, name, "a str path" + (" or None" if allow_none else ""), value)
    return os.path.abspath(os.fspath(value))


@dataclasses.dataclass(frozen=True)
class StopOptions:
    """When ``online_train`` stops (the first condition met wins, after the current step).

    Sources also check ``max_time``, ``stop_event``, ``stop_file`` and the signals while they
    wait for data, so an idle stream stops too. A ``run_context.request_stop()`` from a
    callback and the dataset ending always stop.

    Args:
        max_steps: stop once ``cur_step_num`` (which counts restored steps) reaches it.
        max_time: this call's wall time, in seconds or a ``datetime.timedelta`` (kept as
            seconds).
        stop_event: an object with ``is_set()`` (``threading.Event``,
            ``multiprocessing.Event``); stop once it is set.
        stop_file: stop once this file exists (kept as an absolute path).
        stop_signals: signal numbers whose handlers are installed for the run (the previous
            ones are put back after); not SIGKILL / SIGSTOP. Handlers can only be installed
            from the main thread.
        peer_timeout: under DDP, seconds a rank waits for the others in a collective before
            the job fails (a stalled or dead rank); set on a ``"ddp"``
            strategy given by name, or on a ``DDPStrategy`` left at Lightning's default
            (30 minutes). Default 300.

    Raises:
        TypeError: a field of the wrong type.
        ValueError: ``max_steps`` / ``max_time`` not > 0 (or NaN); an invalid or uncatchable
            signal.

    Example:
        >>> import datetime
        >>> StopOptions(max_time=datetime.timedelta(minutes=1)).max_time
        60.0
    """

    max_steps: int | None = None
    max_time: float | datetime.timedelta | None = None
    stop_event: Any = None
    stop_file: str | os.PathLike | None = None
    stop_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)
    peer_timeout: float | datetime.timedelta = 300.0

    def __post_init__(self) -> None:
        owner = "StopOptions"
        _set(self, "peer_timeout", check_number(
            owner, "peer_timeout", self.peer_timeout.total_seconds()
            if isinstance(self.peer_timeout, datetime.timedelta) else self.peer_timeout,
            minimum=0.0, strict=True))
        check_positive_int(owner, "max_steps", self.max_steps, allow_none=True)
        _set(self, "max_time", _seconds(owner, "max_time", self.max_time))
        ev = self.stop_event
        if ev is not None and not callable(getattr(ev, "is_set", None)):
            raise type_error(owner, "stop_event", "an object with is_set() (a threading.Event "
                             "or multiprocessing.Event) or None", ev)
        _set(self, "stop_file", _dir(owner, "stop_file", self.stop_file, allow_none=True))
        sigs = () if self.stop_signals is None else self.stop_signals
        if not isinstance(sigs, (tuple, list)):
            raise type_error(owner, "stop_signals", "a tuple of signal numbers", sigs)
        for s in sigs:
            if isinstance(s, bool) or not isinstance(s, int) or s not in signal.valid_signals():
                raise value_error(owner, "stop_signals", "a tuple of valid signal numbers", s)
            if s in _UNCATCHABLE:
                raise value_error(owner, "stop_signals", "signals that can be caught (not "
                                  f"{signal.Signals(s).name})", s)
        _set(self, "stop_signals", tuple(int(s) for s in sigs))


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
    """Checkpoints holding the stream cursor, and resuming from them.

    Every ``ckpt_every_n_steps`` steps and/or ``ckpt_every_n_seconds`` (neither: only at the
    end), ``online-{step}.ckpt`` in ``ckpt_dir`` holds the network, the optimizer, the
    loss-scale state, the stream cursor of the last *trained* batch and the counters, written
    atomically. Delivery is at-least-once: after a crash (even ``kill -9``) and a restart,
    every record is trained at least once; those trained twice are the ones after the last
    durable checkpoint (at most one interval, plus the steps trained while the newest
    checkpoint was being written in the background).

    Args:
        ckpt_dir: the folder (kept as an absolute path; created when needed).
        ckpt_every_n_steps: the step cadence, or None.
        ckpt_every_n_seconds: the time cadence (seconds or a ``timedelta``), or None.
        keep_checkpoint_max: how many of the newest checkpoints are kept.
        resume: restore the newest checkpoint of ``ckpt_dir`` first.
        background: write each checkpoint in a background thread from a snapshot taken at
            its step, while training goes on (big embedding tables are copied on write, not
            whole); a checkpoint due while the previous one is still being written waits for
            it. False: the training loop writes the file itself. The final checkpoint is
            always written by the loop.
        full_every_n_checkpoints: with background writes, one checkpoint in this many is
            written whole; the others are *row increments* (``online-{step}-rows.ckpt``):
            of a big embedding table stepped by a row-local optimizer (and its moments) they
            hold only the rows changed since the previous checkpoint, so they write what the
            stream touched, not the table (a table with more than half its rows changed is
            written whole). Reading one reads its chain back to the whole
            checkpoint (:func:`~lit_amp.serialization.load_checkpoint`), and
            ``keep_checkpoint_max`` keeps the chains its newest checkpoints need. The first
            checkpoint of a run, the final one and the one after a failed or abandoned write
            are whole. 1 (the default): every checkpoint is whole.

    Raises:
        TypeError: a field of the wrong type.
        ValueError: a cadence or ``keep_checkpoint_max`` not > 0 (or NaN).

    Example:
        >>> CheckpointOptions("ckpt", ckpt_every_n_steps=500).keep_checkpoint_max
        5
    """

    ckpt_dir: str | os.PathLike
    ckpt_every_n_steps: int | None = None
    ckpt_every_n_seconds: float | datetime.timedelta | None = None
    keep_checkpoint_max: int = 5
    resume: bool = True
    background: bool = True
    full_every_n_checkpoints: int = 1

    def __post_init__(self) -> None:
        owner = "CheckpointOptions"
        _set(self, "ckpt_dir", _dir(owner, "ckpt_dir", self.ckpt_dir))
        check_positive_int(owner, "ckpt_every_n_steps", self.ckpt_every_n_steps, allow_none=True)
        _set(self, "ckpt_every_n_seconds",
             _seconds(owner, "ckpt_every_n_seconds", self.ckpt_every_n_seconds))
        check_positive_int(owner, "keep_checkpoint_max", self.keep_checkpoint_max)
        check_bool(owner, "resume", self.resume)
        check_bool(owner, "background", self.background)
        check_positive_int(owner, "full_every_n_checkpoints", self.full_every_n_checkpoints)


@dataclasses.dataclass(frozen=True)
class PublishOptions:
    """Weights exported for serving (see :mod:`lit_amp.rec.serving`).

    Every ``publish_every_n_steps`` steps and/or ``publish_every_n_seconds`` (also while the
    stream is idle), and at the end, the network's weights are written atomically as
    ``model-{step}.pt`` plus ``LATEST`` in ``publish_dir``; ``publish_hook(info)`` is then
    called with ``{"path", "step", "records", "published_at", "cursor", "kind", "bytes"}``.

    With ``delta=True`` a publish writes numbered versions instead
    (:class:`~lit_amp.rec.serving.writer.DeltaPublisher`): a full snapshot first, then deltas
    holding only the embedding rows the optimizer changed since the previous version (and the dense
    tensors), with a full snapshot every ``full_every_n_publishes`` publishes and whenever a
    delta would exceed ``max_delta_fraction`` of a full one. Row deltas need sparse embedding
    gradients and an optimizer that moves only their rows (``LazyAdam``, ``SparseAdam``,
    ``Adagrad``, ``SGD`` without momentum); otherwise the table is written whole. The weights
    must change only through the optimizer (a change made from a callback is not seen).
    With ``background=True`` (the default) a full snapshot is written by a thread while
    training goes on (``LATEST`` moves past a version only once a full snapshot under it is
    on disk), and so is each delta, from copies taken in the loop (its rows and dense
    tensors): ``LATEST`` names it, and ``publish_hook`` is called for it, at the first step
    end after it is on disk (or at the end of the run). A version that has no delta (the
    first of a run, or one whose delta would be too big) is then only that full snapshot,
    named once it is on disk; the deltas that land meanwhile wait for it, then are named one
    after the other. Whichever the writer, ``publish_hook`` is called for each version in
    publish order, once its file is on disk and while ``LATEST`` names it; never for a
    failed write (whose error stops the run).

    Args:
        publish_dir: the folder (kept as an absolute path; created when needed).
        publish_every_n_steps: the step cadence, or None.
        publish_every_n_seconds: the time cadence (seconds or a ``timedelta``), or None.
        keep_published_max: how many published files are kept (with ``delta``: full
            snapshots, each with its deltas; at least 2 is advised).
        publish_hook: called for each publish once its file is on disk and ``LATEST`` names
            it, or None.
        delta: publish deltas between periodic full snapshots.
        full_every_n_publishes: with ``delta``, a full snapshot every this many publishes.
        max_delta_fraction: with ``delta``, a larger delta (its bytes over a full snapshot's)
            is written as a full snapshot.
        background: with ``delta``, write full snapshots and deltas in background threads.

    Raises:
        TypeError: a field of the wrong type.
        ValueError: a cadence, ``keep_published_max`` or ``full_every_n_publishes`` not > 0
            (or NaN); ``max_delta_fraction`` outside [0, 1].

    Example:
        >>> PublishOptions("serving", publish_every_n_seconds=30).publish_every_n_seconds
        30.0
        >>> PublishOptions("serving", delta=True).full_every_n_publishes
        50
    """

    publish_dir: str | os.PathLike
    publish_every_n_steps: int | None = None
    publish_every_n_seconds: float | datetime.timedelta | None = None
    keep_published_max: int = 3
    publish_hook: Callable[[dict], None] | None = None
    delta: bool = False
    full_every_n_publishes: int = 50
    max_delta_fraction: float = 0.25
    background: bool = True

    def __post_init__(self) -> None:
        owner = "PublishOptions"
        check_bool(owner, "delta", self.delta)
        check_bool(owner, "background", self.background)
        check_positive_int(owner, "full_every_n_publishes", self.full_every_n_publishes)
        _set(self, "max_delta_fraction", check_number(
            owner, "max_delta_fraction", self.max_delta_fraction, minimum=0.0, maximum=1.0))
        _set(self, "publish_dir", _dir(owner, "publish_dir", self.publish_dir))
        check_positive_int(owner, "publish_every_n_steps", self.publish_every_n_steps,
                           allow_none=True)
        _set(self, "publish_every_n_seconds",
             _seconds(owner, "publish_every_n_seconds", self.publish_every_n_seconds))
        check_positive_int(owner, "keep_published_max", self.keep_published_max)
        if self.publish_hook is not None and not callable(self.publish_hook):
            raise type_error(owner, "publish_hook", "callable or None", self.publish_hook)


@dataclasses.dataclass(frozen=True)
class ValidationOptions:
    """Validation every ``valid_every_n_steps`` steps (the model needs ``metrics``).

    The model is evaluated on ``valid_dataset``, or — without one — on a held-out window of
    the next ``valid_window`` batches of the stream, which are evaluated *before* they are
    trained on (test-then-train: the metric is honest and no record is withheld). As in
    ``fit``, custom callbacks and ``TimeMonitor`` get the eval hooks, and
    ``cb_params.metrics`` / ``eval_results`` are visible from then on (in sink mode at that
    batch's ``on_train_epoch_end``).

    Args:
        valid_every_n_steps: the cadence in steps.
        valid_dataset: an iterable of batches, or None for the held-out window.
        valid_window: batches in the held-out window.

    Raises:
        TypeError: a field of the wrong type.
        ValueError: ``valid_every_n_steps`` or ``valid_window`` not > 0.

    Example:
        >>> ValidationOptions(valid_every_n_steps=200).valid_window
        1
    """

    valid_every_n_steps: int
    valid_dataset: Iterable | None = None
    valid_window: int = 1

    def __post_init__(self) -> None:
        owner = "ValidationOptions"
        check_positive_int(owner, "valid_every_n_steps", self.valid_every_n_steps)
        if self.valid_dataset is not None and not isinstance(self.valid_dataset, Iterable):
            raise type_error(owner, "valid_dataset", "an iterable of batches or None",
                             self.valid_dataset)
        check_int(owner, "valid_window", self.valid_window, minimum=1)


@dataclasses.dataclass
class OnlineSummary:
    """What an ``online_train`` call did (MindSpore's returns None; lit_amp returns this).

    Attributes:
        steps: steps trained by this call.
        records: records trained by this call.
        total_steps: ``cur_step_num`` at the end (counting restored steps).
        total_records: records trained, counting those of restored checkpoints.
        stop_reason: ``"max_steps"``, ``"max_time"``, ``"stop_event"``, ``"stop_file"``,
            ``"signal:SIGTERM"`` (or another signal), ``"request_stop"``, ``"source_exhausted"``
            (the source ended cleanly), ``"idle_timeout"`` (``max_idle_s`` spent waiting for
            data), ``"connection_reset"`` / ``"connection_error"`` (a socket broke: restart to
            resume) or ``"peer_stopped"`` (another DDP rank ran out of data or stopped).
        resumed_from: the checkpoint restored, or None.
        last_checkpoint: the newest checkpoint written by this call, or None.
        last_published: the newest published weights written by this call, or None.
        elapsed_s: wall time of the training loop.
        skipped_steps: optimizer steps of this call skipped because a gradient was NaN / inf
            (their batches count as trained; the parameters did not change).

    Example:
        >>> OnlineSummary(steps=3, records=30, stop_reason="max_steps").records
        30
    """

    steps: int = 0
    records: int = 0
    total_steps: int = 0
    total_records: int = 0
    stop_reason: str | None = None
    resumed_from: str | None = None
    last_checkpoint: str | None = None
    last_published: str | None = None
    elapsed_s: float = 0.0
    skipped_steps: int = 0
