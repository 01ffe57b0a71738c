"""MindSpore-style callbacks in anyone's Lightning ``Trainer``: :func:`to_lightning`.

Inside :class:`lit_amp.Model` the callbacks are driven by a
:class:`~lit_amp.callbacks.bridge.MindSporeCallbackBridge` that ``Model`` builds with the run's
``cb_params``. In a plain ``L.Trainer`` nobody builds it: :func:`to_lightning` returns one,
:class:`LightningCallbacks`, which fills ``cb_params`` from the Trainer and the module when the
run is set up, for ``LitModel`` and any other LightningModule (what each field holds there:
docs/migration.md, "Callbacks in your own Trainer")::

    trainer = L.Trainer(max_epochs=10, callbacks=[
        to_lightning([LossMonitor(), History(), EarlyStopping(monitor="acc")]),
        L.pytorch.callbacks.LearningRateMonitor(),   # Lightning's own, as they are
    ])
    trainer.fit(LitModel(net, loss, opt, metrics={"acc"}), train_loader, val_loader)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning as L
import torch

from lit_amp.callbacks.base import Callback, CallbackList, InternalCallbackParam
from lit_amp.callbacks.bridge import MindSporeCallbackBridge

__all__ = ["LightningCallbacks", "to_lightning"]


class LightningCallbacks(MindSporeCallbackBridge):
    """A Lightning callback driving MindSpore-style callbacks (made by :func:`to_lightning`).

    ``cb_params`` (``train_network``, ``network``, ``loss_fn``, ``optimizer``, ``epoch_num``,
    ``batch_num``, ``eval_network``, ``device_number``, ``rank``, ...) are filled from the
    Trainer and the module in ``setup``, for each ``fit`` / ``validate`` call.

    Args:
        callbacks: the MindSpore-style callbacks.

    Example:
        >>> from lit_amp.callbacks import History
        >>> [type(cb).__name__ for cb in LightningCallbacks(CallbackList([History()])).callbacks]
        ['History']
    """

    def __init__(self, callbacks: CallbackList) -> None:
        super().__init__(callbacks, InternalCallbackParam(cur_step_num=0, net_outputs=None))
        #: a plain module's evaluation ran in this training epoch
        self._evaluated = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Fill ``cb_params`` from ``trainer`` and ``pl_module`` (Lightning calls it first)."""
        optimizer = getattr(pl_module, "optimizer", None)
        if not hasattr(optimizer, "param_groups"):
            optimizer = None
        lit_amp_module = _is_lit_model(pl_module)
        self._evaluated = False
        self.cb.update(
            train_network=pl_module,
            network=pl_module.network if lit_amp_module else pl_module,
            loss_fn=getattr(pl_module, "loss_fn", None),
            optimizer=optimizer,
            epoch_num=trainer.max_epochs,
            initial_epoch=0,
            batch_num=None,
            mode="train" if stage == "fit" else "eval",
            parallel_mode="data_parallel" if trainer.world_size > 1 else "stand_alone",
            device_number=trainer.world_size,
            rank=trainer.global_rank,
            eval_network=getattr(pl_module, "eval_network", None) if lit_amp_module else None,
            list_callback=list(self.callbacks.callbacks),
            train_dataset_element=None,
            last_save_ckpt_step=None,
            latest_ckpt_file=None,
            dataset_sink_mode=bool(getattr(pl_module, "sink_mode", False)),
            cur_step_num=0,
            net_outputs=None,
        )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """As the bridge's; ``optimizer`` and ``batch_num`` are known now."""
        if self.cb.get("optimizer") is None and trainer.optimizers:
            self.cb.optimizer = trainer.optimizers[0]
        n = trainer.num_training_batches
        self.cb.batch_num = int(n) if isinstance(n, (int, float)) and n != float("inf") else None
        super().on_train_start(trainer, pl_module)

    # Lightning's sanity check is not an evaluation MindSpore's callbacks would see
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            super().on_validation_start(trainer, pl_module)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            super().on_validation_epoch_start(trainer, pl_module)

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                  batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if not trainer.sanity_checking:
            super().on_validation_batch_start(trainer, pl_module, batch, batch_idx,
                                              dataloader_idx)

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        if not trainer.sanity_checking:
            super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx,
                                            dataloader_idx)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """End the evaluation with ``LitModel``'s results, or what any other module logged."""
        if trainer.sanity_checking:
            return
        if _is_lit_model(pl_module):
            results = pl_module.last_eval_results or {}
        else:
            results = {"metrics": _logged_scalars(trainer.callback_metrics)}
        self.end_eval(results)
        if self._in_fit_eval:
            self._evaluated = not _is_lit_model(pl_module)
            self.end_fit_eval(results)
        else:
            self.callbacks.exit()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """As the bridge's; an evaluated epoch of a plain module shows what it logged by now.

        Lightning aggregates what ``training_step`` logged with ``on_epoch=True`` at the train
        epoch end, after the evaluation: the epoch-end hooks see this epoch's values, not the
        previous epoch's (as Lightning's own ``EarlyStopping`` does).
        """
        if self._evaluated:
            self._set_eval_results({"metrics": _logged_scalars(trainer.callback_metrics)})
            self._evaluated = False
        super().on_train_epoch_end(trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        """As the bridge's, with the loss as ``training_step`` returned it (see the module doc)."""
        k = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        if (k > 1 and pl_module.automatic_optimization and isinstance(outputs, dict)
                and isinstance(outputs.get("loss"), torch.Tensor)):
            # Lightning's automatic optimization divides the step's loss by k before handing it
            # to the callbacks (ClosureResult.from_training_step_output)
            outputs = {**outputs, "loss": outputs["loss"] * k}
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


def _is_lit_model(pl_module: L.LightningModule) -> bool:
    """Whether ``pl_module`` computes MindSpore's evaluation results (``LitModel`` does)."""
    return isinstance(getattr(pl_module, "last_eval_results", None), dict) and isinstance(
        getattr(pl_module, "network", None), torch.nn.Module)


def _logged_scalars(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The scalars of ``trainer.callback_metrics``, as floats (one-element tensors included).

    Args:
        metrics: name -> value, as Lightning keeps what ``self.log`` logged.

    Returns:
        name -> float for every scalar value; other values are left out.

    Example:
        >>> _logged_scalars({"val_acc": torch.tensor(0.75), "n": 3, "img": torch.zeros(2, 2)})
        {'val_acc': 0.75, 'n': 3.0}
    """
    out: dict[str, Any] = {}
    for name, value in metrics.items():
        if isinstance(value, torch.Tensor):
            if value.numel() == 1:
                out[name] = float(value.detach().float().item())
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def to_lightning(callbacks: Callback | list[Callback] | tuple[Callback, ...]) -> LightningCallbacks:
    """One Lightning callback driving MindSpore-style callbacks in a plain ``L.Trainer``.

    Args:
        callbacks: a :class:`lit_amp.callbacks.Callback` or a list/tuple of them (lit_amp's
            built-ins or your own), called in the given order.

    Returns:
        A :class:`LightningCallbacks` to put in ``L.Trainer(callbacks=[...])``.

    Raises:
        TypeError: ``callbacks`` is not a Callback or a list/tuple of Callbacks (a Lightning
            callback in the list is named: give it to the Trainer directly).

    Example:
        >>> from lit_amp.callbacks import History, LossMonitor
        >>> cb = to_lightning([LossMonitor(), History()])
        >>> isinstance(cb, L.Callback), len(cb.callbacks)
        (True, 2)
    """
    items = [callbacks] if isinstance(callbacks, (Callback, L.Callback)) else callbacks
    if not isinstance(items, (list, tuple)):
        raise TypeError(
            "to_lightning: 'callbacks' must be a lit_amp.callbacks.Callback or a list/tuple of "
            f"them, but got {callbacks!r} of type {type(callbacks).__name__}."
        )
    for i, cb in enumerate(items):
        if isinstance(cb, L.Callback):
            raise TypeError(
                f"to_lightning: 'callbacks[{i}]' is the Lightning callback "
                f"{type(cb).__name__}; pass it to L.Trainer(callbacks=[...]) directly and wrap "
                "only the MindSpore-style (lit_amp.callbacks) ones."
            )
    cbl = CallbackList(list(items))
    cbl.check_legacy_methods(raise_error=False)
    return LightningCallbacks(cbl)
