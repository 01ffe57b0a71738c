"""Lightning glue shared by the facades: quiet Trainer calls, LitModel's fast path, strategies.

Private to :mod:`lit_amp.model`. ``quiet_lightning`` and ``split_callbacks`` are public
through :mod:`lit_amp.model.model`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from torch import nn

from lit_amp.callbacks.base import Callback, CallbackList

__all__ = [
    "RESERVED_TRAINER_KEYS",
    "TRAINER_DEFAULTS",
    "make_trainer",
    "nested_call",
    "RankStepCount",
    "check_in_process",
    "all_on_cpu",
    "check_training_strategy",
    "compile_network_instead",
    "fast_path_ok",
    "mean_over_ranks",
    "quiet_lightning",
    "split_callbacks",
]


#: what ``Model`` passes to each ``Trainer`` unless ``Model(trainer={...})`` says otherwise
TRAINER_DEFAULTS: dict[str, Any] = {
    "accelerator": "auto",
    "devices": 1,
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
}
#: set by ``Model`` from the train/fit arguments, never by ``trainer={...}``
RESERVED_TRAINER_KEYS = ("max_epochs", "min_epochs", "max_steps", "callbacks")


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Silence Lightning's start-up banners and data-loader hints for the MindSpore-style API.

    Within the block the ``lightning.pytorch`` / ``lightning.fabric`` loggers log warnings
    and above only, and the data-loader hints Lightning warns about on every call (few
    workers, ``IterableDataset`` with ``__len__``, no ``val_dataloader``...) are ignored.
    The facades (``Model``, ``RecModel``) wrap each ``Trainer`` call in it.

    Example:
        >>> with quiet_lightning():
        ...     logging.getLogger("lightning.pytorch").level
        30
    """
    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*is smaller than the logging interval.*")
        warnings.filterwarnings("ignore", message=".*`IterableDataset` has `__len__` defined.*")
        warnings.filterwarnings("ignore", message=".*Total length of .* across ranks is zero.*")
        warnings.filterwarnings("ignore", message=".*but have no `val_dataloader`.*")
        # "It is recommended to use `self.log('val/acc', ..., sync_dist=True)` when logging on
        # epoch level in distributed setting", once per metric: LitModel logs values already
        # reduced over the ranks (the metrics' own sync, eval_loss by mean_over_ranks), equal
        # on every rank; a second reduction would only round them again
        warnings.filterwarnings("ignore", message=r".*sync_dist=True\)` when logging on epoch.*")
        warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\)`.*")
        try:
            yield
        finally:
            for lg, lvl in zip(loggers, levels):
                lg.setLevel(lvl)


_GRAD_HOOKS = (
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
)


def fast_path_ok(trainer: L.Trainer) -> bool:
    """Whether backward/step may bypass Lightning's wrappers without changing behaviour.

    True on a single device with the default precision plugin and no callback overriding a
    gradient hook: there Lightning's ``manual_backward``/``LightningOptimizer.step`` only add
    per-call bookkeeping (measured ~0.15 ms per step on the overhead benchmark).
    """
    from lightning.pytorch.plugins.precision import Precision
    from lightning.pytorch.strategies import SingleDeviceStrategy

    strategy = trainer.strategy
    if (
        type(strategy) is not SingleDeviceStrategy
        or type(strategy.precision_plugin) is not Precision
    ):
        return False
    for cb in trainer.callbacks:
        for hook in _GRAD_HOOKS:
            if getattr(type(cb), hook) is not getattr(L.Callback, hook):
                return False
    return True


def all_on_cpu(batch: Any) -> bool:
    if torch.is_tensor(batch):
        return batch.device.type == "cpu"
    if isinstance(batch, (list, tuple)):
        return all(all_on_cpu(b) for b in batch)
    if isinstance(batch, dict):
        return all(all_on_cpu(b) for b in batch.values())
    return not hasattr(batch, "to")




def check_training_strategy(strategy: Any, network: nn.Module) -> None:
    """Refuse the sharded strategies LitModel cannot train under, with the way out.

    ``LitModel`` trains the MindSpore way (forward, backward and step inside ``training_step``,
    manual optimization). Lightning's ``FSDPStrategy`` (FSDP1) runs ``training_step`` inside
    the FSDP module's forward, where torch's FSDP cannot take a backward pass (Lightning issues
    #19626/#19685): use ``strategy="fsdp2"`` (FSDP2, :mod:`lit_amp.model.sharding`) instead.
    ``ModelParallelStrategy`` reduces gradients only for parameters that were parallelized
    (DTensors); ``LitModel.configure_model`` shards a plain network under it, so a network
    still without DTensors here would train on every rank alone: refused.
    """
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    way_out = (
        "Train with strategy='fsdp2' (FSDP2: lit_amp shards the network) or 'ddp', or use "
        "your own LightningModule with plugins=[AmpFSDPPrecision(level)] under FSDPStrategy; "
        "infer_train_layout and infer_predict_layout work under both sharded strategies."
    )
    if isinstance(strategy, FSDPStrategy):
        raise ValueError(
            "For 'Model'/'LitModel', the argument 'strategy' must not be Lightning's "
            f"FSDPStrategy (got {type(strategy).__name__}): LitModel runs backward and the "
            "optimizer step inside training_step (manual optimization), which FSDPStrategy does "
            f"not support (Lightning #19685). {way_out}"
        )
    if isinstance(strategy, ModelParallelStrategy):
        from torch.distributed.tensor import DTensor

        if not any(isinstance(p, DTensor) for p in network.parameters()):
            raise ValueError(
                "For 'Model'/'LitModel', the argument 'strategy' is a ModelParallelStrategy but "
                "no parameter of the network is parallelized (no DTensor): every rank would "
                f"train its own copy and the copies would drift apart. {way_out}"
            )


def mean_over_ranks(trainer: L.Trainer | None, total: torch.Tensor | None, n: int) -> float | None:
    """``sum(total) / sum(n)`` over the ranks of ``trainer`` (None when no rank counted any).

    Under DDP every rank takes part, also one that evaluated no batch (``total`` None, ``n``
    0): the others would wait for it otherwise.

    Example:
        >>> mean_over_ranks(None, torch.tensor(3.0), 2)
        1.5
    """
    world = trainer.world_size if trainer is not None else 1
    if not n and world == 1:
        return None
    device = trainer.strategy.root_device if trainer is not None and world > 1 else None
    if total is None:
        total = torch.zeros((), device=device)
    count = torch.tensor(float(n), device=total.device)
    if trainer is not None and world > 1:
        total = trainer.strategy.reduce(total, reduce_op="sum")
        count = trainer.strategy.reduce(count, reduce_op="sum")
    return float(total / count) if float(count) > 0 else None


def split_callbacks(callbacks: Any) -> tuple[CallbackList, list[L.Callback]]:
    """MindSpore callbacks to the bridge; Lightning callbacks straight to the Trainer.

    Args:
        callbacks: None, one callback or a list/tuple of them, each a
            :class:`lit_amp.callbacks.Callback` or a ``lightning.Callback``.

    Returns:
        ``(CallbackList of the MindSpore callbacks, list of the Lightning callbacks)``, each in
        the given order.

    Raises:
        TypeError: ``callbacks`` is not None, a callback or a list/tuple, or an item is
            neither kind of callback.

    Example:
        >>> from lit_amp.callbacks import LossMonitor
        >>> ms, pl = split_callbacks([LossMonitor(), L.pytorch.callbacks.Timer()])
        >>> [type(cb).__name__ for cb in ms], [type(cb).__name__ for cb in pl]
        (['LossMonitor'], ['Timer'])
    """
    if callbacks is None:
        return CallbackList(None), []
    items = [callbacks] if isinstance(callbacks, (Callback, L.Callback)) else callbacks
    if not isinstance(items, (list, tuple)):
        raise TypeError(
            "'callbacks' must be None, a Callback or a list of Callbacks (lit_amp or Lightning), "
            f"but got {type(callbacks).__name__}."
        )
    ms, pl = [], []
    for i, cb in enumerate(items):
        if isinstance(cb, Callback):
            ms.append(cb)
        elif isinstance(cb, L.Callback):
            pl.append(cb)
        else:
            raise TypeError(
                f"'callbacks[{i}]' must be a lit_amp.callbacks.Callback or a Lightning Callback, "
                f"but got {type(cb).__name__}."
            )
    return CallbackList(ms), pl


def make_trainer(trainer_kwargs: dict[str, Any], callbacks: list[L.Callback], *,
                 max_epochs: int | None = None) -> L.Trainer:
    """A ``Trainer`` of the user's arguments over :data:`TRAINER_DEFAULTS`, built quietly.

    ``callbacks`` come first, then the user's own (``trainer_kwargs["callbacks"]``). A
    Strategy *object* is bound to the first Trainer that uses it, so each call (train, then
    eval, ...) gets a fresh copy of the one the user configured.

    Example:
        >>> make_trainer({"accelerator": "cpu"}, [], max_epochs=2).max_epochs
        2
    """
    kw = {**TRAINER_DEFAULTS, **trainer_kwargs}
    if not isinstance(kw.get("strategy", "auto"), str):
        kw["strategy"] = copy.deepcopy(kw["strategy"])
    user_cbs = kw.pop("callbacks", None) or []
    if max_epochs is not None:
        kw["max_epochs"] = max_epochs
    with quiet_lightning():
        return L.Trainer(callbacks=[*callbacks, *user_cbs], **kw)


def _running_fit(trainer: Any) -> bool:
    """Whether ``trainer`` is inside ``fit`` (its loops and counters describe a live run)."""
    state = trainer.state
    return (str(getattr(state.fn, "value", state.fn)) == "fit"
            and str(getattr(state.status, "value", state.status)) == "running")


@contextlib.contextmanager
def nested_call(module: L.LightningModule, trainer: L.Trainer) -> Iterator[None]:
    """Run ``trainer``'s validate / test / predict on ``module`` inside a fit that runs it.

    Model-zoo scripts evaluate from a training callback (``model.eval(ds)`` at an epoch end).
    That call has a Trainer of its own, which Lightning attaches to the module
    (``module.trainer``); left there, everything that asks the module for *its* Trainer
    afterwards -- ``ModelCheckpoint`` (the epoch, global step, loops and callbacks' state of
    each file), logging, the train step -- would read the finished evaluation instead of the
    running fit: the checkpoints written after the evaluation would hold epoch 0, step 0 and
    no loops, and a resume from them would start over. Within the block:

    - the fit's Trainer is attached to ``module`` again at the end (also when the call
      raises), with the hook name the fit was in and LitModel's gradient flags
      (``_trainer_grad``) that the inner call's ``configure_callbacks`` re-read;
    - the inner Trainer's teardown leaves the module where the fit put it (Lightning's
      ``Strategy.teardown`` moves it to the CPU, under the fit's optimizer state, captured
      CUDA graphs and DDP buckets); should it have moved anyway, it goes back to the device
      it was on.

    Outside a running fit (a plain ``Model.eval``), or when ``trainer`` is the fit's own, the
    block changes nothing.

    Args:
        module: the LightningModule both Trainers run.
        trainer: the inner call's Trainer (not started yet).

    Example:
        >>> inner = make_trainer({"accelerator": "cpu"}, [])
        >>> with nested_call(L.LightningModule(), inner):  # no fit is running: nothing to keep
        ...     pass
    """
    outer = getattr(module, "_trainer", None)
    if outer is None or outer is trainer or not _running_fit(outer):
        yield
        return
    fx_name = getattr(module, "_current_fx_name", None)
    grad_flags = module.__dict__.get("_trainer_grad")
    first = next(module.parameters(), None)
    device = first.device if first is not None else None
    module.__dict__["cpu"] = lambda: module  # Strategy.teardown's move, for this call only
    try:
        yield
    finally:
        module.__dict__.pop("cpu", None)
        module.trainer = outer
        module._current_fx_name = fx_name
        if grad_flags is not None:
            module.__dict__["_trainer_grad"] = grad_flags
        if first is not None and first.device != device and type(first.data) is torch.Tensor:
            module.to(device)


class RankStepCount(L.Callback):
    """Sets ``cb_params.batch_num`` to this rank's steps per epoch when training starts.

    Under data parallelism Lightning gives each rank its part of the dataset, so an epoch is
    ``len(dataset) / world_size`` steps per rank; MindSpore's callbacks (LossMonitor's step,
    ModelCheckpoint's names, ``cur_step_num`` arithmetic) count this rank's steps. Put it
    before the MindSpore bridge. Sink mode keeps its ``sink_size`` (every rank runs it).

    Args:
        cb_params: the run's callback parameters.
        sink: whether the run is in sink mode (then nothing changes).

    Example:
        >>> from lit_amp.callbacks.base import InternalCallbackParam
        >>> RankStepCount(InternalCallbackParam(batch_num=16), sink=False).cb_params.batch_num
        16
    """

    def __init__(self, cb_params: Any, *, sink: bool) -> None:
        self.cb_params = cb_params
        self.sink = sink

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        n = trainer.num_training_batches
        if not self.sink and isinstance(n, int) and n > 0:
            self.cb_params.batch_num = n


def check_in_process(trainer: L.Trainer, api: str, requested: Any = None) -> None:
    """Refuse a strategy that trains in processes it starts (``ddp_spawn``, ``ddp_fork``...).

    Their worker processes train copies of the Model; Lightning sends back only the weights
    and the logged scalars, so this process would keep an empty optimizer state, epoch
    counter 0, the old loss scale and boost state and stale callbacks, and a following
    ``train(..., initial_epoch=k)`` would silently restart them (per-class metrics of
    ``eval`` would be dropped the same way). ``Model`` calls it before its Trainer starts;
    ``LitModel`` in the user's own Trainer at fit start (``configure_callbacks``, in the
    workers before they meet: the calling process then raises torch's
    ``ProcessRaisedException`` carrying this message).

    Args:
        trainer: the Trainer of the call.
        api: the calling API (for the message).
        requested: the ``strategy`` the user asked for (named in the message).

    Raises:
        ValueError: the strategy's launcher starts the worker processes itself.

    Example:
        >>> check_in_process(make_trainer({"accelerator": "cpu"}, []), "Model.train")
    """
    from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

    launcher = getattr(trainer.strategy, "launcher", None)
    if isinstance(launcher, _MultiProcessingLauncher):
        method = getattr(launcher, "_start_method", "?")
        name = requested if isinstance(requested, str) else f"ddp_{method}"
        raise ValueError(
            f"For '{api}', the argument 'trainer' must not use a strategy that starts its own "
            f"worker processes (got strategy={name!r}, start method {method!r}): only the "
            "weights would come back "
            "to this process, not the optimizer, loss-scale and boost state, the epoch and "
            "step counters or the callbacks' state, so a later call would silently restart "
            "them. Use strategy='ddp' (Lightning re-runs the script for each process; under "
            "torchrun / srun it joins the processes they start)."
        )


def compile_network_instead(module: L.LightningModule, network: nn.Module) -> bool:
    """``torch.compile(lit_model)`` then ``trainer.fit``: compile ``network``, not the steps.

    Lightning's way of compiling (``model = torch.compile(model); trainer.fit(model)``) hands
    the Trainer the module with its ``forward`` and ``*_step`` methods wrapped by TorchDynamo
    (``lightning.pytorch.utilities.compile.from_compiled``). A LitModel's steps are MindSpore's
    train cell driven by hand -- manual optimization, loss-scale and overflow bookkeeping,
    ``self.log``, the callbacks' counters -- host-side Python that Dynamo cannot trace
    (it failed inside ``self.log`` with an ``InternalTorchDynamoError``). Within a Trainer
    call this puts the steps back and compiles ``network`` instead, with the same Dynamo
    context (the backend and mode given to ``torch.compile``): the backbone's forward and
    backward run compiled, the step logic eagerly. Its parameters and ``state_dict`` keys are
    unchanged (``nn.Module.compile``'s form), so checkpoints load in uncompiled models.

    Args:
        module: the LightningModule the Trainer runs (the LitModel).
        network: the backbone to compile in its place.

    Returns:
        Whether ``module`` had been compiled (its steps are now the uncompiled ones).

    Example:
        >>> compile_network_instead(L.LightningModule(), nn.Linear(2, 2))  # nothing compiled
        False
    """
    ctx = getattr(module, "_compiler_ctx", None)
    if not ctx or ctx.get("compiler") != "dynamo":
        return False
    from lightning.pytorch.utilities.compile import to_uncompiled

    dynamo_ctx = ctx["dynamo_ctx"]
    to_uncompiled(module)
    # nn.Module.compile's form: __call__ (hooks included) goes through the compiled function
    if getattr(network, "_compiled_call_impl", None) is None:
        network._compiled_call_impl = dynamo_ctx(network._call_impl)
    return True
