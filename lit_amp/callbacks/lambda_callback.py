"""MindSpore's ``LambdaCallback``: a callback built from plain functions."""

from __future__ import annotations

from collections.abc import Callable

from lit_amp.callbacks.base import EVAL_HOOKS, TRAIN_HOOKS, Callback, RunContext

__all__ = ["LambdaCallback"]

HookFn = Callable[[RunContext], None] | None


class LambdaCallback(Callback):
    """A callback whose twelve hooks call the given functions with the ``RunContext``.

    A hook left as None does nothing.

    Args:
        on_train_epoch_begin: called at each train epoch begin.
        on_train_epoch_end: called at each train epoch end.
        on_train_step_begin: called at each train step begin.
        on_train_step_end: called at each train step end.
        on_train_begin: called once when training begins.
        on_train_end: called once when training ends.
        on_eval_epoch_begin: called at each eval epoch begin.
        on_eval_epoch_end: called at each eval epoch end.
        on_eval_step_begin: called at each eval step begin.
        on_eval_step_end: called at each eval step end.
        on_eval_begin: called once when evaluation begins.
        on_eval_end: called once when evaluation ends.

    Raises:
        TypeError: a hook is neither None nor callable.

    Example:
        >>> from lit_amp.callbacks.base import RunContext
        >>> cb = LambdaCallback(on_train_step_end=lambda rc: print(rc.original_args().cur_step_num))
        >>> cb.on_train_step_end(RunContext({"cur_step_num": 3}))
        3
    """

    def __init__(
        self,
        on_train_epoch_begin: HookFn = None,
        on_train_epoch_end: HookFn = None,
        on_train_step_begin: HookFn = None,
        on_train_step_end: HookFn = None,
        on_train_begin: HookFn = None,
        on_train_end: HookFn = None,
        on_eval_epoch_begin: HookFn = None,
        on_eval_epoch_end: HookFn = None,
        on_eval_step_begin: HookFn = None,
        on_eval_step_end: HookFn = None,
        on_eval_begin: HookFn = None,
        on_eval_end: HookFn = None,
    ) -> None:
        super().__init__()
        given = dict(locals())
        self._fns: dict[str, HookFn] = {}
        for hook in (*TRAIN_HOOKS, *EVAL_HOOKS):
            fn = given[hook]
            if fn is not None and not callable(fn):
                raise TypeError(
                    f"For 'LambdaCallback', the argument '{hook}' must be None or a callable "
                    f"fn(run_context), but got {fn!r} of type {type(fn).__name__}."
                )
            self._fns[hook] = fn

    def _call(self, hook: str, run_context: RunContext) -> None:
        fn = self._fns[hook]
        if fn is not None:
            fn(run_context)

    def on_train_begin(self, run_context: RunContext) -> None:
        self._call("on_train_begin", run_context)

    def on_train_epoch_begin(self, run_context: RunContext) -> None:
        self._call("on_train_epoch_begin", run_context)

    def on_train_step_begin(self, run_context: RunContext) -> None:
        self._call("on_train_step_begin", run_context)

    def on_train_step_end(self, run_context: RunContext) -> None:
        self._call("on_train_step_end", run_context)

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        self._call("on_train_epoch_end", run_context)

    def on_train_end(self, run_context: RunContext) -> None:
        self._call("on_train_end", run_context)

    def on_eval_begin(self, run_context: RunContext) -> None:
        self._call("on_eval_begin", run_context)

    def on_eval_epoch_begin(self, run_context: RunContext) -> None:
        self._call("on_eval_epoch_begin", run_context)

    def on_eval_step_begin(self, run_context: RunContext) -> None:
        self._call("on_eval_step_begin", run_context)

    def on_eval_step_end(self, run_context: RunContext) -> None:
        self._call("on_eval_step_end", run_context)

    def on_eval_epoch_end(self, run_context: RunContext) -> None:
        self._call("on_eval_epoch_end", run_context)

    def on_eval_end(self, run_context: RunContext) -> None:
        self._call("on_eval_end", run_context)
