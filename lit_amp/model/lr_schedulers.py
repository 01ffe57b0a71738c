"""LR schedulers under ``LitModel``'s manual optimization, stepped as Lightning's automatic
optimization would step them.

Lightning leaves the schedulers to a module that optimizes by hand, and drops the keys that
say how to step them (``monitor``, ``strict``, ``reduce_on_plateau``) with a warning.
``LitModel`` takes those keys from ``configure_optimizers``' output first
(:func:`_take_scheduler_keys`, wrapped around a subclass's hook), plans every scheduler at
train start and steps it: ``"step"`` ones after optimizer steps that were taken (an
overflow-skipped step does not count), ``"epoch"`` ones at epoch ends, plateau ones with the
logged value of their ``monitor``.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

__all__ = ["LrSchedulerMixin"]

#: LR scheduler keys Lightning drops under manual optimization (LitModel honours them)
_SCHEDULER_KEYS = ("monitor", "strict", "reduce_on_plateau")


def _take_scheduler_keys(conf: Any, found: list[tuple[Any, dict[str, Any]]]) -> Any:
    """``configure_optimizers``' output without the keys of :data:`_SCHEDULER_KEYS`.

    Lightning drops them (with a warning to step the schedulers by hand) when a module
    optimizes manually; ``LitModel`` steps its schedulers itself, so it takes them first:
    ``(scheduler, {key: value})`` pairs are appended to ``found``. A ``"monitor"`` beside
    ``"optimizer"`` applies to that dict's ``"lr_scheduler"``, as in Lightning. The user's
    dicts are copied, not changed.

    Example:
        >>> found = []
        >>> _take_scheduler_keys({"optimizer": "opt", "lr_scheduler": "s", "monitor": "m"},
        ...                      found)
        {'optimizer': 'opt', 'lr_scheduler': {'scheduler': 's'}}
        >>> found
        [('s', {'monitor': 'm'})]
    """
    if isinstance(conf, dict) and "scheduler" in conf:
        keys = {k: conf[k] for k in _SCHEDULER_KEYS if k in conf}
        if keys:
            found.append((conf["scheduler"], keys))
        return {k: v for k, v in conf.items() if k not in _SCHEDULER_KEYS}
    if isinstance(conf, dict) and "optimizer" in conf:
        out = dict(conf)
        monitor = out.pop("monitor", None)
        sched = out.get("lr_scheduler")
        if monitor is not None and sched is not None:
            sched = dict(sched) if isinstance(sched, dict) else {"scheduler": sched}
            sched.setdefault("monitor", monitor)
        if sched is not None:
            out["lr_scheduler"] = _take_scheduler_keys(sched, found)
        return out
    if isinstance(conf, list):
        return [_take_scheduler_keys(c, found) for c in conf]
    if type(conf) is tuple:
        return tuple(_take_scheduler_keys(c, found) for c in conf)
    return conf


class LrSchedulerMixin:
    """``LitModel``'s LR scheduler planning and stepping (mixed into the LightningModule)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Wrap a subclass's ``configure_optimizers`` so that the LR scheduler keys Lightning
        drops under manual optimization (``monitor``, ``strict``, ``reduce_on_plateau``)
        reach :meth:`_plan_lr_schedulers` (see :func:`_take_scheduler_keys`)."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("configure_optimizers")
        if own is None or getattr(own, "_lit_amp_keys_taken", False):
            return

        @functools.wraps(own)
        def configure_optimizers(self: Any) -> Any:
            return _take_scheduler_keys(own(self), self.__dict__.setdefault("_lr_keys", []))

        configure_optimizers._lit_amp_keys_taken = True  # type: ignore[attr-defined]
        cls.configure_optimizers = configure_optimizers  # type: ignore[method-assign]

    def configure_optimizers(self) -> Any:
        """Lightning hook: the optimizer; a subclass may return LR schedulers with it.

        Any of Lightning's forms works (``{"optimizer": opt, "lr_scheduler": sched or
        {"scheduler": sched, "interval": "epoch" | "step", "frequency": n, "monitor": key,
        "strict": bool}}``, ``([opt], [sched])``...). LitModel optimizes manually, where
        Lightning leaves the schedulers to the module; LitModel steps them as Lightning's
        automatic optimization would: ``"step"`` ones after every ``frequency``-th optimizer
        step that was taken (an overflow-skipped step does not count), ``"epoch"`` ones at the
        end of every ``frequency``-th training epoch, ``ReduceLROnPlateau`` with the logged
        value of ``monitor`` (see :meth:`_step_lr_schedulers`), all through
        :meth:`lr_scheduler_step`.
        """
        return self._optimizer

    def _plan_lr_schedulers(self) -> None:
        """Check the Trainer's LR scheduler configs and note how each is stepped.

        Raises:
            ValueError: an ``interval`` other than "step"/"epoch", a ``frequency`` that is not
                a positive int, a ``ReduceLROnPlateau`` without ``monitor``.
        """
        keys, self.__dict__["_lr_keys"] = self.__dict__.get("_lr_keys", []), []
        plan = []
        for config in self.trainer.lr_scheduler_configs:
            sched = config.scheduler
            extra = next((k for s, k in reversed(keys) if s is sched), {})
            name = type(sched).__name__
            if config.interval not in ("step", "epoch"):
                raise ValueError(
                    f"For 'LitModel', the 'interval' of the LR scheduler {name} must be 'step' "
                    f"or 'epoch', but got {config.interval!r}."
                )
            freq = config.frequency
            if not isinstance(freq, int) or isinstance(freq, bool) or freq < 1:
                raise ValueError(
                    f"For 'LitModel', the 'frequency' of the LR scheduler {name} must be a "
                    f"positive int, but got {freq!r}."
                )
            plateau = bool(extra.get("reduce_on_plateau")) or isinstance(
                sched, torch.optim.lr_scheduler.ReduceLROnPlateau)
            monitor = extra.get("monitor")
            if plateau and monitor is None:
                raise ValueError(
                    f"For 'LitModel', the LR scheduler {name} reduces on a plateau and needs a "
                    "'monitor': return {'optimizer': opt, 'lr_scheduler': {'scheduler': sched, "
                    "'monitor': 'val/eval_loss'}} (or another logged name) from "
                    "configure_optimizers."
                )
            plan.append((config, plateau, monitor, bool(extra.get("strict", True))))
        self.__dict__["_lr_plan"] = plan
        self._lr_plateau_due = False

    def _step_lr_schedulers(self, interval: str, plateau: bool) -> None:
        """Step the ``interval`` schedulers (plateau ones or the others) that are due now.

        Due: ``"step"`` ones when the number of optimizer steps taken (``global_step``) is a
        multiple of their ``frequency``, ``"epoch"`` ones when the number of the epoch ending
        (``current_epoch + 1``) is. A plateau scheduler gets the value of its ``monitor`` in
        ``trainer.callback_metrics``.

        Raises:
            RuntimeError: a plateau scheduler's ``monitor`` is not among the logged values (a
                warning and no update with ``"strict": False``).
        """
        trainer = self.trainer
        count = trainer.global_step if interval == "step" else trainer.current_epoch + 1
        for config, is_plateau, monitor, strict in self.__dict__["_lr_plan"]:
            if config.interval != interval or is_plateau != plateau or count % config.frequency:
                continue
            value = None
            if is_plateau:
                value = trainer.callback_metrics.get(monitor)
                if value is None:
                    msg = (f"For 'LitModel', the LR scheduler {type(config.scheduler).__name__} "
                           f"monitors {monitor!r}, which is not among the logged values "
                           f"{sorted(trainer.callback_metrics)} at this {interval}'s end")
                    if strict:
                        raise RuntimeError(
                            f"{msg}: log it, monitor one of those, or set 'strict': False in "
                            "the scheduler's dict to skip the update when it is missing."
                        )
                    warnings.warn(f"{msg}: the update is skipped ('strict': False).",
                                  RuntimeWarning, stacklevel=2)
                    continue
            self.lr_scheduler_step(config.scheduler, value)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Lightning's order: epoch schedulers step after the epoch's last batch, before the
        # validation at its end (a checkpoint saved there holds the stepped schedule)
        if self.__dict__["_lr_plan"] and self._at_epoch_end(batch_idx):
            self._step_lr_schedulers("epoch", plateau=False)

    def on_train_epoch_end(self) -> None:
        # plateau schedulers after the epoch's values (validation included) are logged
        if self.__dict__["_lr_plan"]:
            if self._lr_plateau_due:
                self._lr_plateau_due = False
                self._step_lr_schedulers("step", plateau=True)
            self._step_lr_schedulers("epoch", plateau=True)
