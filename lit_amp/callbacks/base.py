"""MindSpore's callback protocol: ``Callback``, ``RunContext`` and the callback parameters.

This module is framework-free (no Lightning import). The Lightning bridge
(:mod:`lit_amp.callbacks.bridge`) fills an :class:`InternalCallbackParam` and calls the hooks
through :class:`CallbackList` in MindSpore's order (docs/semantics.md §1.4-1.6).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import Any

__all__ = [
    "Callback",
    "RunContext",
    "InternalCallbackParam",
    "CallbackList",
    "TRAIN_HOOKS",
    "EVAL_HOOKS",
    "LEGACY_HOOKS",
    "BUILTIN_CALLBACK_NAMES",
]

log = logging.getLogger(__name__)

TRAIN_HOOKS = (
    "on_train_begin",
    "on_train_epoch_begin",
    "on_train_step_begin",
    "on_train_step_end",
    "on_train_epoch_end",
    "on_train_end",
)
EVAL_HOOKS = (
    "on_eval_begin",
    "on_eval_epoch_begin",
    "on_eval_step_begin",
    "on_eval_step_end",
    "on_eval_epoch_end",
    "on_eval_end",
)
LEGACY_HOOKS = ("begin", "epoch_begin", "step_begin", "step_end", "epoch_end", "end")

# Class names MindSpore treats as built-in (``train.callback.__all__``): these are not called
# during fit's evaluation (except TimeMonitor) and are exempt from the legacy-hook check.
BUILTIN_CALLBACK_NAMES = frozenset(
    {
        "Callback",
        "LossMonitor",
        "TimeMonitor",
        "ModelCheckpoint",
        "CheckpointConfig",
        "EarlyStopping",
        "ReduceLROnPlateau",
        "LearningRateScheduler",
        "LambdaCallback",
        "History",
        "OnRequestExit",
        "BackupAndRestore",
        "SummaryCollector",
        "RunContext",
    }
)


class InternalCallbackParam(dict):
    """The ``cb_params`` dict callbacks see; keys are also attributes (``cb.cur_step_num``).

    Example:
        >>> cb = InternalCallbackParam(cur_step_num=3)
        >>> cb.cur_step_num, cb["cur_step_num"]
        (3, 3)
    """

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as exc:
            raise AttributeError(key) from exc

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


class RunContext:
    """What a callback receives: the run's parameters and a way to ask for a stop.

    Args:
        original_args: the callback parameters (a dict).

    Raises:
        TypeError: ``original_args`` is not a dict.

    Example:
        >>> rc = RunContext({"cur_step_num": 1})
        >>> rc.original_args().cur_step_num
        1
        >>> rc.request_stop(); rc.get_stop_requested()
        True
    """

    def __init__(self, original_args: dict) -> None:
        if not isinstance(original_args, dict):
            raise TypeError(
                "RunContext: 'original_args' must be a dict, but got "
                f"{type(original_args).__name__}."
            )
        if not isinstance(original_args, InternalCallbackParam):
            original_args = InternalCallbackParam(original_args)
        self._original_args = original_args
        self._stop_requested = False

    def original_args(self) -> InternalCallbackParam:
        """Return the callback parameters (``cb_params``)."""
        return self._original_args

    def request_stop(self) -> None:
        """Ask training (or evaluation) to stop at the next point it can."""
        self._stop_requested = True

    def get_stop_requested(self) -> bool:
        """Whether a stop was requested."""
        return self._stop_requested


class Callback:
    """Base class of MindSpore-style callbacks.

    Override the new hooks (``on_train_step_end`` ...) or the legacy ones (``step_end`` ...).
    Every new hook delegates to its legacy twin by default, so a callback written with the
    legacy names fires in both training and evaluation, as in MindSpore.

    Example:
        >>> class Count(Callback):
        ...     def __init__(self):
        ...         self.n = 0
        ...     def on_train_step_end(self, run_context):
        ...         self.n += 1
    """

    #: Lightning's ``Trainer`` calls ``on_exception`` on its callbacks when a run fails; a
    #: non-callable value makes it skip this one, so the error :meth:`setup` raises is the one
    #: the user sees
    on_exception = None

    @property
    def state_key(self) -> str:
        """The name Lightning's Trainer reports a callback under (set for its error path)."""
        return type(self).__name__

    def setup(self, *args: Any, **kwargs: Any) -> None:
        """Refuse to run as a Lightning callback: Lightning's hooks are not MindSpore's.

        Lightning's ``Trainer`` calls ``setup`` first on every callback it was given; this
        callback's hooks take a ``RunContext``, so it must be driven by a bridge.

        Raises:
            TypeError: always, naming :func:`lit_amp.callbacks.to_lightning`.

        Example:
            >>> Callback().setup(None, None, "fit")
            Traceback (most recent call last):
            ...
            TypeError: Callback is a MindSpore-style callback (lit_amp.callbacks.Callback) ...
        """
        raise TypeError(
            f"{type(self).__name__} is a MindSpore-style callback (lit_amp.callbacks.Callback) "
            "and cannot be passed to a Lightning Trainer as it is: wrap it, "
            "L.Trainer(callbacks=[lit_amp.callbacks.to_lightning([...])]), or pass it to "
            "lit_amp.Model.train/fit/eval(callbacks=...)."
        )

    def __enter__(self) -> Callback:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    # legacy hooks
    def begin(self, run_context: RunContext) -> None:
        """Called once before the network runs (train or eval)."""

    def epoch_begin(self, run_context: RunContext) -> None:
        """Called before each epoch."""

    def epoch_end(self, run_context: RunContext) -> None:
        """Called after each epoch."""

    def step_begin(self, run_context: RunContext) -> None:
        """Called before each step."""

    def step_end(self, run_context: RunContext) -> None:
        """Called after each step."""

    def end(self, run_context: RunContext) -> None:
        """Called once after the network ran."""

    # new hooks: delegate to the legacy ones
    def on_train_begin(self, run_context: RunContext) -> None:
        self.begin(run_context)

    def on_train_epoch_begin(self, run_context: RunContext) -> None:
        self.epoch_begin(run_context)

    def on_train_step_begin(self, run_context: RunContext) -> None:
        self.step_begin(run_context)

    def on_train_step_end(self, run_context: RunContext) -> None:
        self.step_end(run_context)

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        self.epoch_end(run_context)

    def on_train_end(self, run_context: RunContext) -> None:
        self.end(run_context)

    def on_eval_begin(self, run_context: RunContext) -> None:
        self.begin(run_context)

    def on_eval_epoch_begin(self, run_context: RunContext) -> None:
        self.epoch_begin(run_context)

    def on_eval_step_begin(self, run_context: RunContext) -> None:
        self.step_begin(run_context)

    def on_eval_step_end(self, run_context: RunContext) -> None:
        self.step_end(run_context)

    def on_eval_epoch_end(self, run_context: RunContext) -> None:
        self.epoch_end(run_context)

    def on_eval_end(self, run_context: RunContext) -> None:
        self.end(run_context)


def is_builtin(cb: Any) -> bool:
    """Whether ``cb``'s class name is one of MindSpore's built-in callback names."""
    return type(cb).__name__ in BUILTIN_CALLBACK_NAMES


class CallbackList:
    """An ordered set of MindSpore callbacks called as one (MindSpore's ``CallbackManager``).

    Args:
        callbacks: None, one :class:`Callback`, or a list/tuple of them.

    Raises:
        TypeError: an element is not a :class:`Callback`.

    Example:
        >>> cbs = CallbackList(None)
        >>> len(cbs)
        0
    """

    def __init__(self, callbacks: Callback | Iterable[Callback] | None) -> None:
        if callbacks is None:
            items: list[Callback] = []
        elif isinstance(callbacks, Callback):
            items = [callbacks]
        elif isinstance(callbacks, (list, tuple)):
            items = list(callbacks)
        else:
            raise TypeError(
                "'callbacks' must be None, a Callback or a list of Callbacks, "
                f"but got {type(callbacks).__name__}."
            )
        for i, cb in enumerate(items):
            if not isinstance(cb, Callback):
                raise TypeError(
                    f"'callbacks[{i}]' must be a lit_amp.callbacks.Callback (or a Lightning "
                    "Callback where Lightning callbacks are accepted), but got "
                    f"{type(cb).__name__}."
                )
        self.callbacks = items
        self._stack: contextlib.ExitStack | None = None

    def __len__(self) -> int:
        return len(self.callbacks)

    def __iter__(self):
        return iter(self.callbacks)

    def enter(self) -> None:
        """Enter every callback's context (MindSpore enters them with an ExitStack)."""
        if self._stack is not None:
            return
        self._stack = contextlib.ExitStack()
        entered = []
        for cb in self.callbacks:
            res = self._stack.enter_context(cb)
            if not isinstance(res, Callback):
                log.warning(
                    "%s.__enter__ returned %s, not a Callback; the original object is used.",
                    type(cb).__name__,
                    type(res).__name__,
                )
                res = cb
            entered.append(res)
        self.callbacks = entered

    def exit(self, exc_info: tuple = (None, None, None)) -> None:
        """Leave every callback's context (in reverse order)."""
        if self._stack is None:
            return
        stack, self._stack = self._stack, None
        stack.__exit__(*exc_info)

    def call(self, hook: str, run_context: RunContext) -> None:
        """Call ``hook`` on every callback, in order."""
        for cb in self.callbacks:
            getattr(cb, hook)(run_context)

    def subset_for_eval_during_fit(self) -> CallbackList:
        """The callbacks MindSpore calls during fit's evaluation: custom ones plus TimeMonitor."""
        sub = CallbackList(None)
        sub.callbacks = [
            cb for cb in self.callbacks if not is_builtin(cb) or type(cb).__name__ == "TimeMonitor"
        ]
        return sub

    def check_legacy_methods(self, *, raise_error: bool) -> None:
        """MindSpore's ``_check_methods_for_custom_callbacks``.

        A custom callback (class name not built-in) that defines a legacy hook in its own class
        gets a warning from ``train``/``eval`` and a ValueError from ``fit``.
        """
        for cb in self.callbacks:
            if is_builtin(cb):
                continue
            own = [m for m in LEGACY_HOOKS if m in type(cb).__dict__]
            if own:
                msg = (
                    f"Callback {type(cb).__name__} defines the legacy method(s) {own}; in 'fit' "
                    "use the new names (on_train_step_end, on_eval_step_end, ...) instead, since "
                    "a legacy hook is called in both training and evaluation."
                )
                if raise_error:
                    raise ValueError(msg)
                log.warning(msg)
