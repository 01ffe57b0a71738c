"""``Model``: MindSpore's high-level training facade on a Lightning ``Trainer``.

``Model`` builds a :class:`~lit_amp.model.lit_model.LitModel`, a Lightning ``Trainer`` per call
(options from ``Model(..., trainer={...})``) and the bridge that calls MindSpore callbacks in
MindSpore's order. ``train``/``fit``/``eval``/``predict`` keep MindSpore's signatures, defaults
and argument checks (docs/semantics.md §1.3-1.4).
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from torch import nn

from lit_amp._validation import check_bool, check_int, check_type, type_error, value_error
from lit_amp.callbacks.base import CallbackList, InternalCallbackParam
from lit_amp.callbacks.bridge import MindSporeCallbackBridge
from lit_amp.model._checks import check_sink_size, check_train_args
from lit_amp.model._lightning import (
    RESERVED_TRAINER_KEYS,
    TRAINER_DEFAULTS,
    RankStepCount,
    check_in_process,
    make_trainer,
    nested_call,
    quiet_lightning,
    split_callbacks,
)
from lit_amp.model.data_checks import check_dataset
from lit_amp.model.layout import infer_layouts
from lit_amp.model.lit_model import LitModel
from lit_amp.model.rank_placement import placement_of, rank_data
from lit_amp.model.sharding import is_sharded_strategy
from lit_amp.model.sink_stream import SinkSizeOfRank, SinkStream

__all__ = ["Model", "quiet_lightning", "split_callbacks"]

log = logging.getLogger(__name__)


class Model:
    """MindSpore's ``Model``: train / eval / fit / predict with MindSpore's semantics.

    Args:
        network: the backbone ``torch.nn.Module``.
        loss_fn: the loss module, or None.
        optimizer: a ``torch.optim.Optimizer`` over ``network``'s parameters, or None.
        metrics: a set of MindSpore metric names or a dict name -> torchmetrics ``Metric``.
        eval_network, eval_indexes: a custom eval network and ``[loss, pred, label]`` indexes.
        amp_level: "O0" | "O1" | "O2" | "O3" | "auto".
        boost_level: "O0" | "O1" | "O2".
        trainer: Lightning ``Trainer`` arguments (accelerator, devices, strategy: ``"ddp"``,
            ``"fsdp2"`` (sharded, :mod:`lit_amp.model.sharding`), ..., num_nodes, logger,
            default_root_dir, ...) — lit_amp's one addition to MindSpore's signature.
        **kwargs: exactly MindSpore's ``loss_scale_manager``, ``keep_batchnorm_fp32``,
            ``boost_config_dict``.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
        >>> data = [(torch.randn(16, 4), torch.randint(0, 2, (16,))) for _ in range(4)]
        >>> model = Model(net, nn.CrossEntropyLoss(), opt, metrics={"acc"})
        >>> model.train(2, data)
        >>> sorted(model.eval(data))
        ['acc']
    """

    def __init__(
        self,
        network: nn.Module,
        loss_fn: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        metrics: set | dict | None = None,
        eval_network: nn.Module | None = None,
        eval_indexes: list[int] | None = None,
        amp_level: str = "O0",
        boost_level: str = "O0",
        *,
        trainer: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        check_type("Model", "trainer", trainer, dict, "a dict of lightning.Trainer arguments",
                   allow_none=True)
        bad = sorted(set(trainer or {}) & set(RESERVED_TRAINER_KEYS))
        if bad:
            raise ValueError(
                f"'trainer' must not set {bad}: Model sets them from train/fit arguments "
                "(epoch, callbacks)."
            )
        self._lit = LitModel(
            network,
            loss_fn,
            optimizer,
            metrics,
            eval_network,
            eval_indexes,
            amp_level,
            boost_level,
            **kwargs,
        )
        self._network = network
        self._loss_fn = loss_fn
        self._optimizer = optimizer
        self._metrics = metrics
        self._trainer_kwargs = dict(trainer or {})
        self._current_epoch_num = 0
        self._current_step_num = 0
        self.trainer: L.Trainer | None = None  # the Trainer of the latest call

    # ------------------------------------------------------------------ properties
    @property
    def lit_model(self) -> LitModel:
        """The LightningModule behind this Model."""
        return self._lit

    @property
    def train_network(self) -> nn.Module:
        """The one-step train network (``TrainOneStepCell``-like), or the loss cell."""
        return self._lit.train_network

    @property
    def eval_network(self) -> nn.Module | None:
        """The evaluation network."""
        return self._lit.eval_network

    @property
    def predict_network(self) -> nn.Module:
        """The backbone used by :meth:`predict`."""
        return self._lit.predict_network

    # ------------------------------------------------------------------ trainer
    def _make_trainer(self, *, max_epochs: int | None, callbacks: list[L.Callback]) -> L.Trainer:
        kw = self._trainer_kwargs
        self._lit.log_train_loss = bool(kw.get("logger")) or bool(kw.get("enable_progress_bar"))
        trainer = make_trainer(kw, callbacks, max_epochs=max_epochs)
        check_in_process(trainer, "Model.eval" if max_epochs is None else "Model.train",
                         kw.get("strategy"))
        self.trainer = trainer
        return trainer

    def _pin(self) -> bool:
        acc = self._trainer_kwargs.get("accelerator", "auto")
        return torch.cuda.is_available() and acc in ("auto", "gpu", "cuda")

    # ------------------------------------------------------------------ train / fit
    def train(
        self,
        epoch: int,
        train_dataset: Any,
        callbacks: Any = None,
        dataset_sink_mode: bool = False,
        sink_size: int = -1,
        initial_epoch: int = 0,
    ) -> None:
        """Train for epochs ``initial_epoch + 1 .. epoch`` (``epoch`` is the final epoch number).

        Args:
            epoch: the final epoch number.
            train_dataset: a DataLoader or re-iterable of ``(data, label)`` batches.
            callbacks: MindSpore and/or Lightning callbacks.
            dataset_sink_mode: run each epoch as one sink of ``sink_size`` steps.
            sink_size: steps per sink epoch; -1 means the dataset size.
            initial_epoch: epochs already done (resume).

        Raises:
            TypeError, ValueError: bad arguments (see docs/semantics.md §1.3); ValueError also for a
                strategy that starts its own processes (``ddp_spawn``: use ``'ddp'``).
        """
        size, _ = check_train_args(  # sink_size=-1 is resolved per rank (_run_train)
            "Model.train", epoch, train_dataset, dataset_sink_mode, sink_size, initial_epoch
        )
        cbl, pl_cbs = split_callbacks(callbacks)
        cbl.check_legacy_methods(raise_error=False)
        self._run_train(
            epoch, train_dataset, cbl, pl_cbs, dataset_sink_mode, sink_size, size, initial_epoch
        )

    def fit(
        self,
        epoch: int,
        train_dataset: Any,
        valid_dataset: Any = None,
        valid_frequency: int | list[int] = 1,
        callbacks: Any = None,
        dataset_sink_mode: bool = False,
        valid_dataset_sink_mode: bool = False,
        sink_size: int = -1,
        initial_epoch: int = 0,
    ) -> None:
        """Train, evaluating ``valid_dataset`` after the epochs ``valid_frequency`` selects.

        Args:
            valid_frequency: evaluate after epoch e when ``e % valid_frequency == 0`` (int) or
                ``e in valid_frequency`` (list of absolute 1-based epochs).
            valid_dataset_sink_mode: accepted for compatibility; evaluation always runs one
                pass over ``valid_dataset``.
            Others: as :meth:`train`.

        Raises:
            TypeError: ``valid_frequency`` is not an int or a list.
            ValueError: ``valid_frequency`` is an int <= 0.
            ValueError: ``valid_dataset`` without metrics; custom callbacks with legacy hooks.
        """
        size, _ = check_train_args(
            "Model.fit", epoch, train_dataset, dataset_sink_mode, sink_size, initial_epoch
        )
        if isinstance(valid_frequency, bool) or not isinstance(valid_frequency, (int, list)):
            raise type_error("Model.fit", "valid_frequency", "an int or a list of epochs",
                             valid_frequency)
        if isinstance(valid_frequency, list) and not all(
            isinstance(e, int) and not isinstance(e, bool) and e >= 1 for e in valid_frequency
        ):
            raise value_error("Model.fit", "valid_frequency",
                              "a positive int or a list of epochs >= 1", valid_frequency)
        if isinstance(valid_frequency, int) and valid_frequency <= 0:
            # MindSpore 2.10: 0 dies with ZeroDivisionError, a negative int evaluates every epoch
            raise value_error("Model.fit", "valid_frequency",
                              "a positive int (or a list of epochs)", valid_frequency)
        check_bool("Model.fit", "valid_dataset_sink_mode", valid_dataset_sink_mode)
        if valid_dataset is not None:
            if not self._lit.metric_fns:
                raise ValueError(
                    "'valid_dataset' needs 'metrics': construct the Model with metrics={...}."
                )
            check_dataset(valid_dataset, "valid_dataset")
        cbl, pl_cbs = split_callbacks(callbacks)
        cbl.check_legacy_methods(raise_error=True)
        self._run_train(
            epoch,
            train_dataset,
            cbl,
            pl_cbs,
            dataset_sink_mode,
            sink_size,
            size,
            initial_epoch,
            valid_dataset=valid_dataset,
            valid_frequency=valid_frequency,
        )

    def _run_train(
        self,
        epoch: int,
        train_dataset: Any,
        cbl: CallbackList,
        pl_cbs: list[L.Callback],
        sink: bool,
        sink_size: int,
        size: int | None,
        initial_epoch: int,
        *,
        valid_dataset: Any = None,
        valid_frequency: int | list[int] = 1,
    ) -> None:
        lit = self._lit
        self._apply_amp()
        fit_data = train_dataset
        resumed_batches = 0
        for cb in cbl:
            if type(cb).__name__ == "BackupAndRestore":
                initial_epoch = max(initial_epoch, int(cb.restore(lit)))
                fit_data = cb.prepare_dataset(fit_data, sink, initial_epoch)  # RNG, position
                resumed_batches = max(resumed_batches, cb.resume_step_num)
        if initial_epoch >= epoch:
            log.info("Nothing to train: epoch %d was already reached (restored).", epoch)
            return
        per_pass = sink and sink_size == -1  # a sink = one pass of this rank's part
        sink_size = size if per_pass else sink_size  # (until the ranks are placed)
        batch_num = sink_size if sink else size
        cb_params = self._train_callback_params(
            cbl, epoch, initial_epoch, batch_num, sink, train_dataset, valid_dataset
        )
        bridge = MindSporeCallbackBridge(
            cbl,
            cb_params,
            sink_size=sink_size if sink else 1,
            initial_epoch=initial_epoch,
            valid_frequency=valid_frequency,
            eval_during_fit=valid_dataset is not None,
        )
        # this rank's part
        data = (SinkStream(fit_data, sink_size, pin_memory=self._pin(), per_pass=per_pass,
                           placement=lambda: placement_of(lit))
                if sink else rank_data(fit_data, lit, train=True))
        trainer = self._make_trainer(max_epochs=epoch - initial_epoch, callbacks=[
            *([SinkSizeOfRank(data, cb_params, bridge)] if per_pass else []),
            RankStepCount(cb_params, sink=sink), bridge, *pl_cbs])
        lit.epoch_offset = initial_epoch  # checkpoints and loggers count the epochs done before
        lit.batch_offset = resumed_batches  # and the batches of a mid-epoch resume
        lit.sink_mode = sink
        try:
            with quiet_lightning():
                trainer.fit(lit, train_dataloaders=data,
                            val_dataloaders=self._rank_data(valid_dataset, train=False))
        finally:
            lit.sink_mode = False
        self._current_epoch_num = int(cb_params.get("cur_epoch_num", initial_epoch))
        step = int(cb_params.cur_step_num)
        batch_num = cb_params.batch_num  # this rank's steps per epoch (RankStepCount)
        self._current_step_num = (step - 1) % batch_num + 1 if step > 0 and batch_num else 0

    def _train_callback_params(
        self,
        cbl: CallbackList,
        epoch: int,
        initial_epoch: int,
        batch_num: int | None,
        sink: bool,
        train_dataset: Any,
        valid_dataset: Any,
    ) -> InternalCallbackParam:
        """The ``cb_params`` MindSpore's train loop hands its callbacks."""
        return InternalCallbackParam(
            train_network=self._lit,
            network=self._network,
            loss_fn=self._loss_fn,
            optimizer=self._optimizer,
            epoch_num=epoch - initial_epoch,
            initial_epoch=initial_epoch,
            batch_num=batch_num,
            mode="train",
            parallel_mode=("data_parallel" if self._trainer_kwargs.get("strategy")
                           else "stand_alone"),
            device_number=1,
            rank=0,
            train_dataset=train_dataset,
            valid_dataset=valid_dataset,
            eval_network=self._lit.eval_network,
            list_callback=list(cbl.callbacks),
            train_dataset_element=None,
            last_save_ckpt_step=None,
            latest_ckpt_file=None,
            dataset_sink_mode=sink,
            cur_step_num=0,
            net_outputs=None,
        )

    def _rank_data(self, dataset: Any, *, train: bool) -> Any:
        return rank_data(dataset, self._lit, train=train)

    def _apply_amp(self) -> None:  # no cast cache when FSDP re-gathers into the same storage
        sharded = is_sharded_strategy(self._trainer_kwargs.get("strategy"))
        self._lit.apply_amp(self._device_hint(), cache_casts=not sharded)

    def _device_hint(self) -> torch.device:
        acc = self._trainer_kwargs.get("accelerator", "auto")
        return torch.device("cuda" if torch.cuda.is_available() and acc in ("auto", "gpu", "cuda")
                            else "cpu")

    # ------------------------------------------------------------------ eval
    def eval(
        self, valid_dataset: Any, callbacks: Any = None, dataset_sink_mode: bool = False
    ) -> dict[str, Any]:
        """Evaluate; returns ``{metric_name: value}`` (floats, or numpy arrays per class).

        Raises:
            ValueError: the Model has no metrics, or the dataset is empty/unsized.
        """
        if not self._lit.metric_fns:
            raise ValueError(
                "Model.eval needs 'metrics': construct the Model with metrics={...} "
                "(for example {'acc'})."
            )
        check_bool("Model.eval", "dataset_sink_mode", dataset_sink_mode)
        size = check_dataset(valid_dataset, "valid_dataset")
        cbl, pl_cbs = split_callbacks(callbacks)
        cbl.check_legacy_methods(raise_error=False)
        lit = self._lit
        self._apply_amp()
        cb_params = InternalCallbackParam(
            network=self._network,
            eval_network=lit.eval_network,
            valid_dataset=valid_dataset,
            batch_num=size,
            mode="eval",
            cur_step_num=0,
            list_callback=list(cbl.callbacks),
            dataset_sink_mode=dataset_sink_mode,
            device_number=1,
            rank=0,
            loss_fn=self._loss_fn,
            net_outputs=None,
        )
        bridge = MindSporeCallbackBridge(cbl, cb_params)
        trainer = self._make_trainer(max_epochs=None, callbacks=[bridge, *pl_cbs])
        try:  # from a training callback: the module goes back to the training run's Trainer
            with quiet_lightning(), nested_call(lit, trainer):
                trainer.validate(lit, dataloaders=self._rank_data(valid_dataset, train=False),
                                 verbose=False)
        finally:
            if lit._trainer is not None and lit._trainer is not trainer:
                self.trainer = lit._trainer  # the running training call stays the latest
        metrics = dict(lit.last_eval_results.get("metrics", {}))
        return metrics

    # ------------------------------------------------------------------ predict
    def predict(self, *predict_data: Any) -> Any:
        """The network's raw output on the inputs (eval mode, no gradients), on the device the
        Model trains on (Lightning leaves the network on the CPU after a call: it moves back)."""
        self._apply_amp()
        net, dev = self._network, self._device_hint()
        if self.trainer is not None and self.trainer.strategy.root_device.type == "cuda":
            dev = self.trainer.strategy.root_device  # the GPU it trained on
        p = next(net.parameters(), None)
        if p is not None and type(p.data) is not torch.Tensor:  # DTensor shards (FSDP2)
            dev = p.device
        else:
            net.to(dev)
        inputs = [x.to(dev) if torch.is_tensor(x) else x for x in predict_data]
        net.eval()
        with torch.no_grad():
            return net(*inputs)

    # ------------------------------------------------------------------ build / layouts
    def build(
        self,
        train_dataset: Any = None,
        valid_dataset: Any = None,
        sink_size: int = -1,
        epoch: int = 1,
    ) -> None:
        """Prepare the networks ahead of training (apply the AMP level, run one forward pass).

        MindSpore compiles its graphs here; PyTorch needs no compilation, so this validates the
        arguments, converts the network for ``amp_level`` and warms it up on one batch.

        Raises:
            ValueError: both datasets are None, or sink_size is invalid.
            RuntimeError: ``valid_dataset`` is given but the Model has no metrics.
        """
        if train_dataset is None and valid_dataset is None:
            raise ValueError(
                "Model.build: 'train_dataset' and 'valid_dataset' cannot both be None."
            )
        check_sink_size("Model.build", sink_size)
        check_int("Model.build", "epoch", epoch, minimum=1)
        if valid_dataset is not None and not self._lit.metric_fns:
            raise RuntimeError("Model.build: 'valid_dataset' needs the Model to have 'metrics'.")
        self._apply_amp()
        for ds, name in ((train_dataset, "train_dataset"), (valid_dataset, "valid_dataset")):
            if ds is None:
                continue
            check_dataset(ds, name, sink=True, sink_size=max(sink_size, 1))
            first = next(iter(ds))
            with torch.no_grad():
                self.predict(first[0] if isinstance(first, (tuple, list)) else first)
        self._network.train()

    def infer_train_layout(
        self, train_dataset: Any, dataset_sink_mode: bool = True, sink_size: int = -1
    ) -> dict:
        """Each parameter's sharding layout under a sharded strategy (FSDP / DTensor).

        MindSpore compiles the parallel train graph and returns each parameter's layout; here
        the Model's strategy is set up on ``train_dataset`` (one Trainer ``fit`` that stops
        before the first step, on every rank) and the layout of each parameter of the network
        is read from the sharded model — or directly, when the network's parameters already
        are ``DTensor``s (``fully_shard`` / tensor parallelism applied by the caller).

        Args:
            train_dataset: the training data (only its first batch may be touched).
            dataset_sink_mode: accepted for MindSpore compatibility.
            sink_size: accepted for MindSpore compatibility.

        Returns:
            ``{parameter name: layout}`` for this rank, each layout a dict with
            ``placements`` (e.g. ``["Shard(dim=0)"]``, ``["Replicate()"]``, ``["Shard(flat)"]``
            for FSDP's flattened shards), ``device_mesh`` (mesh shape), ``mesh_dim_names``,
            ``global_shape``, ``local_shape`` (this rank's shard; FSDP: ``[numel]`` of its
            flat slice) and ``rank``.

        Raises:
            RuntimeError: the Model has no sharded strategy (``trainer={'strategy': 'fsdp'}``,
                ``ModelParallelStrategy``) and the network has no sharded parameters — as
                MindSpore outside (semi-)auto parallel.

        Example:
            >>> net = nn.Linear(2, 2)
            >>> Model(net, nn.MSELoss(), torch.optim.SGD(net.parameters(), 0.1)).infer_train_layout(
            ...     [(torch.randn(4, 2), torch.randn(4, 2))])
            Traceback (most recent call last):
            ...
            RuntimeError: infer_train_layout: parameter layouts need a sharded strategy ...
        """
        return self._layout("infer_train_layout", train_dataset)

    def infer_predict_layout(self, *predict_data: Any) -> dict:
        """As :meth:`infer_train_layout`, for the predict network on ``predict_data``.

        Raises:
            RuntimeError: no sharded strategy and no sharded parameters.
        """
        return self._layout("infer_predict_layout", predict_data)

    def _layout(self, api: str, data: Any = None) -> dict:
        kw = {**TRAINER_DEFAULTS, **self._trainer_kwargs}
        return infer_layouts(api, self._lit, self._network, kw, data)

    # ------------------------------------------------------------------ misc
    def __repr__(self) -> str:
        return (
            f"Model(network={type(self._network).__name__}, amp_level={self._lit.amp_level!r}, "
            f"metrics={sorted(self._lit.metric_fns) if self._lit.metric_fns else None})"
        )
