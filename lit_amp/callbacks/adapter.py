"""MindSpore-style callbacks in anyone's Lightning ``Trainer``: :func:`to_lightning`.

Inside :class:`lit_amp.Model` the callbacks are driven by a
:class:`~lit_amp.callbacks.bridge.MindSporeCallbackBridge` that ``Model`` builds with the run's
``cb_params``. In a plain ``L.Trainer`` (a ``LitModel`` in your own script) nobody builds it:
:func:`to_lightning` returns one, :class:`LightningCallbacks`, which fills ``cb_params`` from
the Trainer and the module when the run is set up::

    trainer = L.Trainer(max_epochs=10, callbacks=[
        to_lightning([LossMonitor(), History(), EarlyStopping(monitor="acc")]),
        L.pytorch.callbacks.LearningRateMonitor(),   # Lightning's own, as they are
    ])
    trainer.fit(LitModel(net, loss, opt, metrics={"acc"}), train_loader, val_loader)

The hooks map as in ``Model.fit``: Lightning's validation during ``fit`` is MindSpore's
evaluation during training (``cb_params.eval_results`` / ``metrics`` set for the epoch end,
``on_eval_*`` called on custom callbacks and ``TimeMonitor`` only), ``trainer.validate`` is
``Model.eval``. Lightning's sanity-check validation is not shown to the callbacks (MindSpore
has none). The evaluation results are read from the module's ``last_eval_results`` (what
``LitModel`` computes); a LightningModule without it gives the callbacks empty metrics.
"""

from __future__ import annotations

from typing import Any

import lightning as L

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

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Fill ``cb_params`` from ``trainer`` and ``pl_module`` (Lightning calls it first)."""
        optimizer = getattr(pl_module, "optimizer", None)
        if not hasattr(optimizer, "param_groups"):
            optimizer = None
        self.cb.update(
            train_network=pl_module,
            network=getattr(pl_module, "network", pl_module),
            loss_fn=getattr(pl_module, "loss_fn", None),
            optimizer=optimizer,
            epoch_num=trainer.max_epochs,
            initial_epoch=0,
            batch_num=None,
            mode="train" if stage == "fit" else "eval",
            parallel_mode="data_parallel" if trainer.world_size > 1 else "stand_alone",
            device_number=trainer.world_size,
            rank=trainer.global_rank,
            eval_network=getattr(pl_module, "eval_network", None),
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
        if not trainer.sanity_checking:
            super().on_validation_end(trainer, pl_module)


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
