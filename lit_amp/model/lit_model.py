"""``LitModel``: MindSpore's ``Model`` networks (train / eval / predict) as a LightningModule.

It takes ``Model``'s constructor (docs/semantics.md §1.1, minus ``trainer``), builds the same
three networks (§1.2) and trains with manual optimization exactly like MindSpore's
``TrainOneStepCell`` (forward, fp32 loss, scaled backward, unscale, overflow check, step or
skip), so it works in anyone's Trainer, Lightning's habits included (``accumulate_grad_batches``,
gradient clipping, ``train/``-``val/``-``test/`` logging, ``load_from_checkpoint``):

    L.Trainer(max_epochs=3).fit(LitModel(net, loss, opt, metrics={"acc"}), train_dl, val_dl)

Its hooks share the networks and step counters, so they are methods of the module, written in
mixins beside it: the train step (``train_step``, also the seam the sink CUDA graph drives),
evaluation, LR schedulers and the checkpoint state (``lit_state``).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import lightning as L
import torch
from torch import nn

from lit_amp.amp.cells import TrainOneStepCell, WithEvalCell, WithLossCell
from lit_amp.amp.levels import LEVEL_TABLE
from lit_amp.amp.loss_scale.controller import LossScaleController
from lit_amp.metrics import get_metrics
from lit_amp.model._checks import MODEL_KWARGS, check_model_arguments
from lit_amp.model._lightning import (
    all_on_cpu,
    check_in_process,
    check_training_strategy,
    compile_network_instead,
    fast_path_ok,
)
from lit_amp.model.data_checks import as_batch_tuple
from lit_amp.model.evaluation import EvaluationMixin
from lit_amp.model.graph_plan import check_sink_graph
from lit_amp.model.graph_sink import SinkGraph
from lit_amp.model.lit_state import CheckpointStateMixin
from lit_amp.model.lr_schedulers import LrSchedulerMixin
from lit_amp.model.sharding import broadcast_buffers, is_fsdp2, prepare_sharded
from lit_amp.model.train_step import TrainStepMixin

__all__ = ["LitModel", "MODEL_KWARGS"]

log = logging.getLogger(__name__)


class LitModel(TrainStepMixin, EvaluationMixin, LrSchedulerMixin, CheckpointStateMixin,
               L.LightningModule):
    """MindSpore's ``Model`` networks as a LightningModule.

    Args:
        network: the backbone, a ``torch.nn.Module``.
        loss_fn: the loss module, or None (then ``network`` computes its own loss).
        optimizer: a ``torch.optim.Optimizer`` over ``network``'s parameters, or None (then
            ``network`` does its own backward and update, as in MindSpore).
        metrics: a set of MindSpore metric names or a dict name -> torchmetrics ``Metric``.
        eval_network: a custom evaluation network (used as-is).
        eval_indexes: ``[loss_index, predict_index, label_index]`` into ``eval_network``'s
            outputs.
        amp_level: one of :data:`~lit_amp.amp.names.AMP_LEVELS` ("O0": none).
        boost_level: one of :data:`~lit_amp.amp.names.BOOST_LEVELS` ("O0": none).
        **kwargs: exactly MindSpore's: ``loss_scale_manager``, ``keep_batchnorm_fp32``,
            ``boost_config_dict`` (``acc_level`` is a deprecated alias of boost_level).

    Raises:
        TypeError: ``network`` is not a Module, ``metrics`` is not a set/dict, a level is
            not a str.
        ValueError: an unknown kwarg or level, ``eval_indexes`` not three ints, amp_level
            other than O0 or a loss_scale_manager without an optimizer, metrics without
            eval_network and loss_fn.

    Example:
        >>> net = nn.Linear(4, 3)
        >>> lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
        ...                metrics={"acc"})
        >>> sorted(lit.metric_fns)
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
        **kwargs: Any,
    ) -> None:
        super().__init__()
        boost_level = check_model_arguments(
            network, loss_fn, optimizer, eval_network, eval_indexes, amp_level, boost_level, kwargs
        )
        self.metric_fns = get_metrics(metrics)
        if self.metric_fns and eval_network is None and loss_fn is None:
            raise ValueError(
                "'metrics' is set but neither 'eval_network' nor 'loss_fn' is: the evaluation "
                "network cannot be built; pass loss_fn or eval_network."
            )
        self.network = network
        self.loss_fn = loss_fn
        self._optimizer = optimizer
        self.amp_level = amp_level
        self.boost_level = boost_level
        self.amp_kwargs = {
            k: kwargs[k] for k in ("loss_scale_manager", "keep_batchnorm_fp32") if k in kwargs
        }
        self.boost_config_dict = kwargs.get("boost_config_dict")
        # one AutoBoost per model (no global state); config errors surface here
        self.boost: Any = self._make_boost(eval_network)
        # steps between optimizer updates (gradient accumulation; set by boost's algorithm)
        self.grad_accumulation_steps = 1
        self._accum_i = 0
        # Lightning's Trainer(accumulate_grad_batches=, gradient_clip_val=, ...), honoured here
        self._trainer_grad: dict[str, Any] = {"accumulate": 1, "clip_val": None,
                                              "clip_algorithm": None}
        self._epoch_last_batch = False
        #: epochs trained before the current Trainer's run (``Model.train(initial_epoch=k)``):
        #: checkpoints count them, so that Lightning resumes a file at its absolute epoch
        self.epoch_offset = 0
        #: batches of the first epoch trained before the current Trainer's run (a run that
        #: ``BackupAndRestore`` resumes mid-epoch): the loggers' step counts them
        self.batch_offset = 0
        self.automatic_optimization = False
        self.log_train_loss = True  # Model turns this off when nothing would show the value
        self._amp_applied = False
        self._strategy_checked = False
        self.amp_config: Any = None
        self.loss_scale: Any = None  # a LossScaleController once the level is applied
        self._build_networks(eval_network, eval_indexes)
        self._eval_loss_sum: torch.Tensor | None = None
        self._eval_loss_n = 0
        self.last_eval_results: dict[str, Any] = {}
        self.sink_mode = False
        self.sink_graph = False  # opt-in: a forward's Python runs once, at capture
        # the SinkGraph of the current train call; the latest one's status (not registered)
        self.__dict__["_sink_graph_run"] = self.__dict__["_sink_graph_status"] = None
        self._fast = False
        self._lopt: Any = None
        self._ddp: Any = None  # the DistributedDataParallel wrapper while training under DDP
        # LR schedulers (see configure_optimizers): the keys Lightning drops, the run's plan
        self.__dict__["_lr_keys"] = []
        self.__dict__["_lr_plan"] = []
        self._lr_plateau_due = False
        if metrics is not None:
            self._metric_module = nn.ModuleDict(self.metric_fns)

    def _make_boost(self, eval_network: nn.Module | None) -> Any:
        """The ``AutoBoost`` for ``boost_level``, or None (MindSpore's conditions)."""
        if self.boost_level == "O0":
            return None
        if self._optimizer is None or (eval_network is None and not self.metric_fns):
            log.warning(
                "boost_level=%r is skipped: boost needs 'optimizer' and either "
                "'eval_network' or 'metrics' (MindSpore's rule).",
                self.boost_level,
            )
            return None
        from lit_amp.boost import AutoBoost

        return AutoBoost(self.boost_level, self.boost_config_dict)

    def _build_networks(self, eval_network: nn.Module | None,
                        eval_indexes: list[int] | None) -> None:
        """MindSpore's train and eval networks around the backbone (the predict network)."""
        network, loss_fn = self.network, self.loss_fn
        if self._optimizer is not None:
            loss_net = WithLossCell(network, loss_fn) if loss_fn is not None else network
            self._train_network: nn.Module = TrainOneStepCell(loss_net, self._optimizer)
        elif loss_fn is not None:
            self._train_network = WithLossCell(network, loss_fn)
        else:
            self._train_network = network
        self.eval_indexes = eval_indexes
        if eval_network is not None:
            self._eval_network: nn.Module | None = eval_network
            own = {id(p) for p in network.parameters()}
            if any(id(p) not in own for p in eval_network.parameters()):
                self.user_eval_network = eval_network  # registered: has parameters of its own
        elif self.metric_fns:
            # MindSpore's rule: a level that casts the network ("auto" resolves to O2) casts
            # the eval outputs back to float32
            casts = self.amp_level == "auto" or (
                LEVEL_TABLE.get(self.amp_level, {}).get("cast_model_type") == "low")
            self._eval_network = WithEvalCell(network, loss_fn, add_cast_fp32=casts)
            self.eval_indexes = [0, 1, 2]
        else:
            self._eval_network = None

    def __setattr__(self, name: str, value: Any) -> None:
        # Lightning sets ``_current_fx_name`` around every hook call (~20 times a step);
        # nn.Module.__setattr__'s parameter/module bookkeeping is not needed for it.
        if name == "_current_fx_name":
            self.__dict__[name] = value
            return
        super().__setattr__(name, value)

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        if device.type == "cpu" and all_on_cpu(batch):
            return batch  # nothing to move: skip the per-batch collection walk
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    # ------------------------------------------------------------------ properties
    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The user's torch optimizer."""
        return self._optimizer

    @property
    def train_network(self) -> nn.Module:
        """The MindSpore-style train network: a callable one-step module (or the loss cell)."""
        return self._train_network

    @property
    def eval_network(self) -> nn.Module | None:
        """The evaluation network (``WithEvalCell`` or the user's)."""
        return self._eval_network

    @property
    def predict_network(self) -> nn.Module:
        """The backbone."""
        return self.network

    @property
    def sink_mode(self) -> bool:
        """Whether each ``training_step`` batch is a sink: a list of ``sink_size`` batches.

        ``Model.train(..., dataset_sink_mode=True)`` sets it for the duration of the call (the
        data then comes from a ``SinkStream``); it is False otherwise.

        Example:
            >>> lit = LitModel(nn.Linear(2, 2))
            >>> lit.sink_mode = True
            >>> lit.sink_mode
            True
        """
        return self._sink

    @sink_mode.setter
    def sink_mode(self, value: bool) -> None:
        self._sink = bool(value)

    @property
    def sink_graph(self) -> bool | str:
        """Whether a sink's train steps replay one captured CUDA graph (CUDA only).

        ``False`` (default) or ``"off"``: never; ``"auto"``: when
        :func:`~lit_amp.model.graph_plan.plan_sink_graph` allows it; ``True``: always (a
        RuntimeError names what prevents it). Opt in only for a network whose forward has no
        host-side state (Python in the forward runs once, at capture). See
        :mod:`lit_amp.model.graph_sink`.

        Example:
            >>> lit = LitModel(nn.Linear(2, 2))
            >>> lit.sink_graph = "off"
            >>> lit.sink_graph
            'off'
        """
        return self._sink_graph

    @sink_graph.setter
    def sink_graph(self, value: bool | str) -> None:
        self._sink_graph = check_sink_graph(value)

    @property
    def sink_graph_status(self) -> dict[str, Any]:
        """The latest train call's sink graph: ``{"captured", "reason", "replayed_steps",
        "eager_steps", "captures"}`` (see :class:`~lit_amp.model.graph_sink.SinkGraph`)."""
        run = self.__dict__.get("_sink_graph_status")
        if run is None:
            return {"captured": False, "reason": "no sink has run", "replayed_steps": 0,
                    "eager_steps": 0, "captures": 0}
        return run.status

    def forward(self, *inputs: Any) -> Any:
        """The backbone's forward (what ``predict`` returns)."""
        return self.network(*inputs)

    # ------------------------------------------------------------------ amp
    def apply_amp(self, device: torch.device | str | None = None, *,
                  cache_casts: bool = True) -> None:
        """Convert the network for ``amp_level`` in place (once), on ``device``'s defaults.

        ``cache_casts=False`` under sharded strategies (FSDP): their unsharded parameters are
        re-gathered into the same storage at every forward, invisibly to the cast cache.
        """
        if self._amp_applied:
            return
        self._amp_applied = True
        if self.amp_level == "O0" and not self.amp_kwargs:
            return
        if device is None:
            device = next(self.network.parameters(), torch.empty(0)).device
        from lit_amp.amp.convert import apply_amp_config
        from lit_amp.amp.levels import resolve_amp_config

        kw: dict[str, Any] = {}
        if "keep_batchnorm_fp32" in self.amp_kwargs:
            kw["keep_batchnorm_fp32"] = self.amp_kwargs["keep_batchnorm_fp32"]
        if "loss_scale_manager" in self.amp_kwargs:
            kw["loss_scale_manager"] = self.amp_kwargs["loss_scale_manager"]
        self.amp_config = resolve_amp_config(self.amp_level, device=device,
                                             cache_casts=cache_casts, **kw)
        apply_amp_config(self.network, self.amp_config)
        if self.amp_config.loss_scale_manager is not None:
            self.loss_scale = LossScaleController(self.amp_config.loss_scale_manager)
            pending = self.__dict__.pop("_pending_loss_scale", None)
            if pending is not None:  # loaded (load_checkpoint_state) before the level applied
                self.loss_scale.load_state_dict(pending)

    def configure_model(self) -> None:
        """Lightning hook: apply the AMP level before the strategy wraps the module.

        Under a ``ModelParallelStrategy`` (``strategy="fsdp2"``) the network is then sharded
        with FSDP2 (once; see :mod:`lit_amp.model.sharding`) and the optimizer re-pointed at
        the sharded parameters, after the AMP hooks, so that they see gathered parameters.
        A LitModel given to the Trainer through ``torch.compile`` has its network compiled
        instead of its steps (see :func:`~lit_amp.model._lightning.compile_network_instead`).
        """
        compile_network_instead(self, self.network)
        if self._trainer is None:
            self.apply_amp(None)
            return
        strategy = self.trainer.strategy
        sharded = any(k in type(strategy).__name__.lower() for k in ("fsdp", "modelparallel"))
        self.apply_amp(strategy.root_device, cache_casts=not sharded)
        if is_fsdp2(strategy):
            fitting = str(getattr(self.trainer.state.fn, "value", "")) == "fit"
            prepare_sharded(self, strategy, fitting=fitting)

    # ------------------------------------------------------------------ boost
    def configure_callbacks(self) -> list:
        """Lightning hook: ``AutoBoost`` for ``boost_level`` (MindSpore's conditions, §3.1 of
        docs/semantics.md).

        Boost needs an optimizer and an eval network or metrics; otherwise MindSpore skips it
        with a warning at construction, and so does lit_amp. The same AutoBoost serves every
        call, so its freeze schedule continues across ``Model.train`` calls.
        """
        self._take_trainer_gradient_flags()
        if self._trainer is not None and self.trainer.state.fn == "fit":  # ddp_spawn/_fork
            check_in_process(self.trainer, "LitModel.fit")
        return [self.boost] if self.boost is not None else []

    def _take_trainer_gradient_flags(self) -> None:
        """Take ``Trainer(accumulate_grad_batches=, gradient_clip_val=/_algorithm=)`` over.

        Lightning refuses both flags for manual optimization before ``setup``; this hook runs
        before that check, so the values move to the module (the train step honours them) and
        :meth:`setup` puts them back on the Trainer afterwards.
        """
        if self._trainer is None:
            return
        trainer = self.trainer
        accumulate = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        clip_val = getattr(trainer, "gradient_clip_val", None)
        algorithm = getattr(trainer, "gradient_clip_algorithm", None)
        fitting = str(getattr(trainer.state.fn, "value", trainer.state.fn)) == "fit"
        if fitting and self._optimizer is None and (accumulate != 1 or clip_val):
            raise ValueError(
                f"Trainer(accumulate_grad_batches={accumulate}, gradient_clip_val={clip_val!r}) "
                "needs LitModel's optimizer, but this LitModel was built with optimizer=None "
                "(the network updates itself); pass an optimizer or remove the Trainer flags."
            )
        self._trainer_grad = {"accumulate": accumulate, "clip_val": clip_val,
                              "clip_algorithm": algorithm}
        trainer.accumulate_grad_batches = 1
        trainer.gradient_clip_val = None

    def setup(self, stage: str) -> None:
        """Lightning hook: give the Trainer its gradient flags back (see configure_callbacks)."""
        if self._trainer is not None:
            self.trainer.accumulate_grad_batches = self._trainer_grad["accumulate"]
            self.trainer.gradient_clip_val = self._trainer_grad["clip_val"]

    # ------------------------------------------------------------------ training
    def on_fit_start(self) -> None:
        # MindSpore sets the network to train mode for each train call (``set_train(True)``):
        # a Model.predict / eval before it leaves the modules in eval mode
        self.train()

    def on_fit_end(self) -> None:
        self.epoch_offset = self.batch_offset = 0  # Model.train's offsets end with its run

    def on_train_start(self) -> None:
        self.continue_logged_counters(self.trainer)
        self._release_sink_graph()
        self.__dict__["_sink_graph_status"] = None
        self._lopt = self.optimizers() if self._optimizer is not None else None
        self._fast = fast_path_ok(self.trainer)
        if self._trainer_grad["accumulate"] > 1:
            self._accum_i = 0  # Lightning's windows start with the run
        if self._trainer_grad["accumulate"] > 1 and self.grad_accumulation_steps > 1:
            raise ValueError(
                f"Trainer(accumulate_grad_batches={self._trainer_grad['accumulate']}) and boost's "
                f"grad_accumulation_step={self.grad_accumulation_steps} both accumulate "
                "gradients; use one of them."
            )
        # kept out of nn.Module's registry: the wrapper holds this module (no cycle)
        self.__dict__["_ddp"] = self._ddp_module()
        self._plan_lr_schedulers()

    def on_train_end(self) -> None:
        self.__dict__["_lr_plan"] = []
        self._release_sink_graph()
        self._lopt = None
        self._broadcast_buffers()
        self._ddp = None

    def _release_sink_graph(self) -> None:
        run = self.__dict__.get("_sink_graph_run")
        self.__dict__["_sink_graph_run"] = None
        if run is not None:
            run.release()

    def _broadcast_buffers(self) -> None:
        """Under DDP, rank 0's buffers to every rank (what DDP does before each forward).

        The last step's BatchNorm statistics are each rank's own; taking rank 0's after
        training and before an evaluation during fit makes every rank evaluate, save and end
        with the same model.
        """
        broadcast_buffers(self.network)  # FSDP2: buffers are not sharded (no-op otherwise)
        ddp = self._ddp_module()
        if ddp is not None and ddp.broadcast_buffers:
            for buf in ddp.modules_buffers:
                torch.distributed.broadcast(buf, src=0)

    def _ddp_module(self) -> Any:
        """The ``DistributedDataParallel`` wrapper of this module (None outside DDP)."""
        from torch.nn.parallel import DistributedDataParallel

        model = self.trainer.strategy.model if self._trainer is not None else None
        return model if isinstance(model, DistributedDataParallel) else None

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Lightning turns DDP's gradient sync off after a manual-optimization forward, which
        # also stops DDP's buffer broadcast before the next forward (BatchNorm statistics
        # would drift apart per rank): ask for the broadcast each step, as plain DDP does
        # (not when DDP's sync is off for good, as under AdaSum, which averages the buffers)
        if self._ddp is not None and self._ddp.require_backward_grad_sync:
            self._ddp.require_forward_param_sync = True
        if self._lr_plateau_due:  # the previous step's values are logged now
            self._lr_plateau_due = False
            self._step_lr_schedulers("step", plateau=True)

    def _at_epoch_end(self, batch_idx: int) -> bool:
        """Whether ``batch_idx`` is the epoch's last training batch (Lightning's test)."""
        loop = self.trainer.fit_loop.epoch_loop
        total = self.trainer.num_training_batches
        return bool(loop.batch_progress.is_last_batch) or batch_idx + 1 >= total

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        if batch_idx == 0 or not self._strategy_checked:
            check_training_strategy(self.trainer.strategy, self.network)
            self._strategy_checked = True
        if not self.network.training:  # a Model.predict / eval from a callback mid-epoch
            self.train()
        if self._trainer_grad["accumulate"] > 1 and not self.sink_mode:
            # (in sink mode the sinks are one continuous stream of steps, as in MindSpore)
            self._epoch_last_batch = self._at_epoch_end(batch_idx)
        if self.sink_mode:
            # the sink: sink_size steps in one tight loop, batches drawn (and moved) one by one,
            # replayed as one CUDA graph where allowed (lit_amp.model.graph_sink)
            steps = batch.batches(self.device) if hasattr(batch, "batches") else batch
            run = self.__dict__.get("_sink_graph_run")
            if run is None:
                run = self.__dict__["_sink_graph_run"] = SinkGraph(self, self.device)
                self.__dict__["_sink_graph_status"] = run
            out = run.run(steps)
        else:
            out = self.train_one_step(batch)
        if self.log_train_loss and torch.is_tensor(out.get("loss")):
            self.log("train/loss", out["loss"].float(), prog_bar=True, on_step=True,
                     on_epoch=False)
            if self.loss_scale is not None and self.loss_scale.enabled:
                self.log("train/loss_scale", float(self.loss_scale.scale), on_step=True,
                         on_epoch=False)
                self.log("train/skipped_steps", float(self.loss_scale.skipped_steps),
                         on_step=True, on_epoch=False)
        return out

    # ------------------------------------------------------------------ predict
    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        """The backbone on the batch's inputs (MindSpore's ``predict`` takes inputs only).

        With a ``loss_fn`` the network takes one input (training feeds it ``data`` of each
        ``(data, label)`` pair), so a ``(data, label)`` batch -- the usual evaluation loader
        -- is predicted from ``data`` alone. Without a ``loss_fn`` every element of the batch
        is an input, as in training.

        Example:
            >>> lit = LitModel(nn.Linear(4, 3), nn.CrossEntropyLoss())
            >>> lit.predict_step((torch.randn(2, 4), torch.tensor([0, 1])), 0).shape
            torch.Size([2, 3])
        """
        inputs = as_batch_tuple(batch, expect_pair=False)
        if self.loss_fn is not None and len(inputs) == 2:
            inputs = inputs[:1]
        return self.network(*inputs)


# Lightning inspects ``training_step``'s signature on every batch (is ``batch_idx`` taken?);
# a precomputed ``__signature__`` makes that lookup cheap.
LitModel.training_step.__signature__ = inspect.signature(LitModel.training_step)
