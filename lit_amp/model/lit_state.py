"""The checkpoint state of ``LitModel`` (one checkpoint format).

:class:`CheckpointStateMixin` holds ``LitModel``'s checkpoint methods: ``checkpoint_state`` is
Lightning's checkpoint dict (what ``Trainer.save_checkpoint`` writes, plus lit_amp's keys),
``load_checkpoint_state`` reads it back (and lit_amp's older files), and Lightning's hooks
``on_save_checkpoint`` / ``on_load_checkpoint`` / ``load_from_checkpoint`` carry the loss
scale and accept the train/eval cells' aliases. Under FSDP2 the states are gathered into full
state dicts (a collective).
"""

from __future__ import annotations

import inspect
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

__all__ = ["CheckpointStateMixin"]


class CheckpointStateMixin:
    """``LitModel``'s checkpoint methods (mixed into the LightningModule before it)."""

    def checkpoint_state(self) -> dict:
        """This module's checkpoint: Lightning's checkpoint dict (one format).

        While a Trainer fits this module, it is what ``Trainer.save_checkpoint`` writes (the
        Trainer's ``dump_checkpoint``: ``state_dict``, ``optimizer_states``, ``loops``,
        ``callbacks``, ``epoch``, ``global_step``, the loss scale under
        ``"lit_amp_loss_scale"``, ...); otherwise the same dict without the Trainer's parts.
        The boost state is added under ``"lit_amp_boost"``. Parameters sharded by FSDP2
        (DTensors) are gathered into full state dicts on the CPU -- a collective: under
        DDP/FSDP call it on every rank.

        Returns:
            The checkpoint dict (:func:`lit_amp.save_checkpoint` adds ``append_info``).

        Example:
            >>> import torch
            >>> from lit_amp import LitModel
            >>> net = nn.Linear(2, 1)
            >>> lit = LitModel(net, nn.MSELoss(), torch.optim.SGD(net.parameters(), 0.1))
            >>> state = lit.checkpoint_state()
            >>> sorted(state["state_dict"])[:2], len(state["optimizer_states"])
            (['_train_network.network.backbone.bias', '_train_network.network.backbone.weight'], 1)
        """
        from lit_amp.serialization import BOOST_KEY, PREFIX_KEY

        trainer = self._trainer
        if trainer is not None and _fitting(trainer):
            # a dump (not a load): the full training state, as Trainer.save_checkpoint writes
            state = trainer._checkpoint_connector.dump_checkpoint(False)
            if self.epoch_offset:
                # (the batches that stepped, the loggers' step, count from the run's start
                # already: continue_logged_counters)
                batches, steps, _ = self._per_epoch(trainer)
                _shift_progress(state, self.epoch_offset, self.epoch_offset * batches,
                                self.epoch_offset * steps, 0)
        else:
            state = {"epoch": 0, "global_step": 0,
                     "pytorch-lightning_version": L.__version__}
            state["state_dict"], optimizer = self._full_states()
            if optimizer is not None:
                state["optimizer_states"], state["lr_schedulers"] = [optimizer], []
            self.on_save_checkpoint(state)
        state[PREFIX_KEY] = "network."
        if self.boost is not None:
            state[BOOST_KEY] = self.boost.state_dict()
        return state

    def continue_logged_counters(self, trainer: Any) -> None:
        """At train start: the loggers' epoch and step continue those of the epochs (and
        batches of a mid-epoch resume) trained before this Trainer's run.

        Lightning logs each row at step ``_batches_that_stepped`` (also its ``log_every_n_steps``
        cadence) with ``epoch = current_epoch``; both count from this Trainer's start, so a
        resumed run's log would start again at epoch 0, step 0. The step counter is moved on
        by the batches that stepped before (checkpoints then hold the run's count too), and
        the epoch Lightning adds to a row by ``epoch_offset``.
        """
        if not (self.epoch_offset or self.batch_offset):
            return
        _, _, stepped = self._per_epoch(trainer)
        accumulate = max(int(trainer.accumulate_grad_batches or 1), 1)
        loop = trainer.fit_loop.epoch_loop
        loop._batches_that_stepped += (self.epoch_offset * stepped
                                       + -(-self.batch_offset // accumulate))
        connector, offset = trainer._logger_connector, self.epoch_offset
        log_metrics = connector.log_metrics

        def log_continued(metrics: dict, step: int | None = None) -> None:
            if metrics and offset and step is None and not {"step", "epoch"} & set(metrics):
                metrics = {**metrics, "epoch": trainer.current_epoch + offset}
            log_metrics(metrics, step)

        connector.log_metrics = log_continued

    def _per_epoch(self, trainer: Any) -> tuple[int, int, int]:
        """One epoch of ``trainer``: its batches, optimizer steps and batches that stepped.

        Lightning counts batches (``batch_progress``; in sink mode a batch is a whole sink of
        ``sink_size`` steps), the optimizer steps LitModel takes (``global_step``) and the
        batches that closed an accumulation window (``_batches_that_stepped``). All 0 when the
        epoch's length is unknown.
        """
        batches = trainer.num_training_batches
        if not isinstance(batches, int) or batches <= 0:
            return 0, 0, 0
        sink_size = getattr(trainer.train_dataloader, "sink_size", 1) if self.sink_mode else 1
        steps = batches * (sink_size if isinstance(sink_size, int) and sink_size > 0 else 1)
        n = max(self.grad_accumulation_steps, self._trainer_grad["accumulate"])
        stepped = -(-batches // max(int(trainer.accumulate_grad_batches or 1), 1))
        return batches, -(-steps // n), stepped

    def _full_states(self) -> tuple[dict, dict | None]:
        """The module's and the optimizer's state dicts; full (gathered) ones under FSDP2."""
        if not _sharded(self):
            opt = self._optimizer.state_dict() if self._optimizer is not None else None
            return self.state_dict(), opt
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        sd = get_model_state_dict(self, options=options)
        opt = None
        if self._optimizer is not None:
            opt = get_optimizer_state_dict(self, self._optimizer, options=options)
        return sd, opt

    def load_checkpoint_state(self, state: dict) -> None:
        """Inverse of :meth:`checkpoint_state`; takes every kind of checkpoint dict.

        Lightning's (``state_dict`` with this module's names, ``optimizer_states``, the loss
        scale under ``"lit_amp_loss_scale"``) or lit_amp's older ``{"network", "optimizer",
        "loss_scale", "boost"}``. The weights load strictly (every parameter, nothing else).
        Under FSDP2 the full state dicts are scattered back into the shards (every rank calls
        it with the same dict).

        Args:
            state: the checkpoint dict (as :func:`lit_amp.load_checkpoint` returns it).

        Raises:
            RuntimeError: keys are missing or unexpected, or a shape differs.
            ValueError: the dict holds none of the network's parameters.
        """
        from lit_amp.serialization import BOOST_KEY, LOSS_SCALE_KEY, network_state

        if self.boost is not None:  # the saved weights are those after boost's surgery (LessBN)
            self.boost.network_auto_process_train(self.network, self._optimizer)
        if isinstance(state.get("state_dict"), dict):
            weights = network_state(state["state_dict"], self.network)
            opts = state.get("optimizer_states") or [None]
            optimizer, scale = opts[0], state.get(LOSS_SCALE_KEY)
            boost = state.get(BOOST_KEY)
        else:
            weights, optimizer = state["network"], state.get("optimizer")
            scale, boost = state.get("loss_scale", state.get(LOSS_SCALE_KEY)), state.get("boost")
        self._set_full_states(weights, optimizer)
        if self.loss_scale is not None and scale is not None:
            self.loss_scale.load_state_dict(scale)
        elif scale is not None and not self._amp_applied:
            self._pending_loss_scale = scale  # the controller exists once the level is applied
        if self.boost is not None and boost:
            self.boost.load_state_dict(boost)

    def _set_full_states(self, weights: dict, optimizer: dict | None) -> None:
        """Load the backbone's weights (strict) and the optimizer state; FSDP2-aware."""
        if not _sharded(self):
            self.network.load_state_dict(weights, strict=True)
            if self._optimizer is not None and optimizer is not None:
                self._optimizer.load_state_dict(optimizer)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, strict=True)
        # (torch replaces the dicts' tensors by shards in place: give it copies of the dicts)
        set_model_state_dict(self.network, _containers_copy(weights), options=options)
        if self._optimizer is not None and optimizer is not None:
            set_optimizer_state_dict(self, self._optimizer, _containers_copy(optimizer),
                                     options=options)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Lightning hook: add the loss-scale state under ``"lit_amp_loss_scale"``."""
        if self.loss_scale is not None:
            checkpoint[self.loss_scale.STATE_KEY] = self.loss_scale.state_dict()

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None,
                             hparams_file: Any = None, strict: bool | None = None,
                             weights_only: bool | None = True, **kwargs: Any) -> Any:
        """Lightning's ``load_from_checkpoint``; the modules are passed again as keywords.

        A checkpoint holds weights, not code: pass the network (and the ``loss_fn``,
        ``optimizer``, ``metrics``, levels it was trained with) as keywords; Lightning builds
        ``LitModel(**kwargs)`` and loads the weights strictly.

        Args:
            checkpoint_path: the ``.ckpt`` file: Lightning's or lit_amp's (``ModelCheckpoint``,
                ``BackupAndRestore``, :func:`lit_amp.save_checkpoint` of a LitModel -- one format).
            map_location: as Lightning's.
            hparams_file: as Lightning's.
            strict: as Lightning's (default: strict).
            weights_only: unpickle tensors and plain containers only (the default here, so
                that a file from elsewhere cannot run code); False only for a trusted file.
            **kwargs: ``network=`` (required) and the other constructor arguments.

        Returns:
            The LitModel with the checkpoint's weights.

        Raises:
            TypeError: ``network=`` is not given.

        Example::

            lit = LitModel.load_from_checkpoint(path, network=CNN1D(),
                                                loss_fn=nn.CrossEntropyLoss())
        """
        param = inspect.signature(cls.__init__).parameters.get("network")
        required = param is not None and param.default is inspect.Parameter.empty
        if required and "network" not in kwargs:
            raise TypeError(
                f"{cls.__name__}.load_from_checkpoint({str(checkpoint_path)!r}) needs the network "
                "as a keyword: a checkpoint holds weights, not modules. Pass network=<the module "
                "it was trained with> (and loss_fn=, optimizer=, metrics= as at training), or "
                "load the weights alone with lit_amp.load_checkpoint(path, net=network)."
            )
        parent = super().load_from_checkpoint
        return parent(checkpoint_path, map_location=map_location, hparams_file=hparams_file,
                      strict=strict, weights_only=weights_only, **kwargs)

    def _aliased_state(self, sd: dict) -> dict:
        """Lightning's ``state_dict`` entries under this module's names.

        The train and eval cells hold the backbone again (``_train_network.network.backbone.*``,
        ``_eval_network.network.*``); their names depend on whether the saving module had an
        optimizer or metrics. Their entries are taken from the backbone's (``network.*``) and
        the saved cells' duplicates are dropped, so that a checkpoint loads into a LitModel
        built with other ``optimizer``/``metrics``.
        """
        own = self.state_dict(keep_vars=True)
        first: dict[int, str] = {}
        for k, v in own.items():
            first.setdefault(id(v), k)
        out = {k: v for k, v in sd.items()
               if k in own or not k.startswith(("_train_network.", "_eval_network."))}
        for k, v in own.items():
            if k not in out and first[id(v)] in sd:
                out[k] = sd[first[id(v)]]
        return out

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Lightning hook: accept the cells' aliases, restore the loss scale, and warn when a
        ``Trainer.fit(..., ckpt_path=)`` resumes from a file without a training position."""
        _warn_without_position(self._trainer, checkpoint)
        if isinstance(checkpoint.get("state_dict"), dict):
            checkpoint["state_dict"] = self._aliased_state(checkpoint["state_dict"])
        from lit_amp.serialization import LOSS_SCALE_KEY

        scale = checkpoint.get(LOSS_SCALE_KEY)
        if self.loss_scale is not None and scale is not None:
            self.loss_scale.load_state_dict(scale)
        elif scale is not None and not self._amp_applied:
            self._pending_loss_scale = scale  # the controller exists once the level is applied


def _warn_without_position(trainer: Any, checkpoint: dict) -> None:
    """Warn, naming the file, when ``trainer`` resumes a fit from a checkpoint without loops.

    Lightning restores the epoch and step from a checkpoint's ``"loops"``; a file without them
    (saved outside a fit, e.g. :func:`lit_amp.save_checkpoint` of an idle module) restores the
    weights and the optimizer and then trains from epoch 0, step 0 again, silently.
    """
    if trainer is None or not _fitting(trainer) or "loops" in checkpoint:
        return
    path = getattr(trainer, "ckpt_path", None)
    rank_zero_warn(
        f"The checkpoint {str(path)!r} holds no training position (no 'loops'; epoch "
        f"{checkpoint.get('epoch', 0)}, global step {checkpoint.get('global_step', 0)}): the "
        "weights and the optimizer state are restored, but training starts again at epoch 0, "
        "step 0. Resume from a file that ModelCheckpoint / Trainer.save_checkpoint wrote during "
        "training, or load it with lit_amp.load_checkpoint and pass Model.train(..., "
        "initial_epoch=<epochs done>).",
        category=UserWarning,
    )


def _shift_progress(state: dict, epochs: int, batches: int, steps: int, stepped: int) -> None:
    """Count ``epochs`` epochs of ``batches`` batches, ``steps`` optimizer steps and ``stepped``
    batches that stepped, done before this Trainer's run, in a Lightning checkpoint dict (its
    ``epoch``, ``global_step`` and fit-loop progress)."""
    state["epoch"] = int(state.get("epoch", 0)) + epochs
    state["global_step"] = int(state.get("global_step", 0)) + steps
    fit = state.get("loops", {}).get("fit_loop", {})
    shifts = {"epoch_progress": epochs, "epoch_loop.batch_progress": batches,
              "epoch_loop.manual_optimization.optim_step_progress": steps}
    for key, by in shifts.items():
        progress = fit.get(key)
        if not isinstance(progress, dict) or not by:
            continue
        # "current" counts within the epoch (batches) or within the run (epochs, steps)
        parts = ("total",) if key == "epoch_loop.batch_progress" else ("total", "current")
        for part in parts:
            counters = progress.get(part, {})
            for name in counters:
                counters[name] += by
    inner = fit.get("epoch_loop.state_dict")
    if isinstance(inner, dict) and "_batches_that_stepped" in inner:
        inner["_batches_that_stepped"] += stepped


def _fitting(trainer: Any) -> bool:
    """Whether ``trainer`` is inside ``fit`` (its ``dump_checkpoint`` describes a live run)."""
    state = trainer.state
    return (str(getattr(state.fn, "value", state.fn)) == "fit"
            and str(getattr(state.status, "value", state.status)) == "running")


def _containers_copy(obj: Any) -> Any:
    """``obj`` with its dicts and lists copied (the tensors in them shared)."""
    if isinstance(obj, dict):
        return {k: _containers_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_containers_copy(v) for v in obj]
    return obj


def _sharded(module: nn.Module) -> bool:
    """Whether any parameter of ``module`` is a DTensor (sharded by FSDP2)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return any(isinstance(p, DTensor) for p in module.parameters())
