"""Build step of ``lit-amp``: a composed config -> data, network, optimizer, callbacks, Model.

Every ``_target_`` goes through the one instantiate helper (:mod:`lit_amp.cli.instantiate`);
a value that a lit_amp class rejects is reported as one :class:`ConfigError` naming the config
key. THOR's ``steps_per_epoch: null`` is filled from the training data; a THOR optimizer turns
the Model into a ``ThorModel``; ``mode=online`` builds a ``RecModel``.

Example:
    >>> batch_size([(torch.zeros(4, 2), torch.zeros(4)), (torch.zeros(3, 2), torch.zeros(3))])
    7
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from enum import Enum
from typing import Any

import torch
from hydra.errors import CompactHydraException
from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint
from lightning.pytorch.callbacks import ThroughputMonitor
from omegaconf import DictConfig, ListConfig

from lit_amp.cli import preemption
from lit_amp.cli.console import piped
from lit_amp.cli.instantiate import check_targets, instantiate
from lit_amp.cli.launch import torchrun_trainer_kwargs
from lit_amp.cli.precheck import check_config
from lit_amp.cli.schema import ConfigError, _name, _plain
from lit_amp.cli.trust import current_grants

__all__ = ["Built", "build", "batch_size", "hyperparameters", "throughput_monitor"]

#: the most training batches Lightning's ThroughputMonitor averages over
THROUGHPUT_WINDOW = 100

Make = Callable[..., Any]


@dataclasses.dataclass
class Built:
    """Everything :func:`build` made from a config.

    Attributes:
        model: the ``Model`` (``ThorModel`` for THOR, ``RecModel`` for ``mode=online``).
        network, loss_fn, optimizer, metrics: what the Model was built from.
        train, valid: the training data (a stream source in online mode) and the evaluation
            data (None when the data node gives none).
        callbacks: MindSpore and Lightning callbacks for train/fit/online_train.
        trainer_kwargs: the ``trainer={...}`` dict given to the Model.
        model_kwargs: MindSpore's kwargs given to the Model (loss_scale_manager, ...).
    """

    model: Any
    network: Any
    loss_fn: Any
    optimizer: Any
    metrics: Any
    train: Any
    valid: Any
    callbacks: list
    trainer_kwargs: dict
    model_kwargs: dict


def batch_size(batch: Any) -> int:
    """Samples in a batch: ``(x, y)`` tuples, dicts of tensors, or a sink's list of batches.

    Args:
        batch: what the DataLoader (or a sink) yields.

    Returns:
        The number of samples (0 when none can be found).

    Example:
        >>> batch_size((torch.zeros(5, 3), torch.zeros(5))), batch_size({"x": torch.zeros(2)})
        (5, 2)
    """
    if torch.is_tensor(batch):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(getattr(batch, "samples", None), int):  # a lazy sink (lit_amp.model.sink_stream)
        return batch.samples
    if isinstance(batch, Mapping):
        for v in batch.values():
            return batch_size(v)
        return 0
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        if isinstance(first, (list, tuple)) and len(batch) > 1 and not torch.is_tensor(first):
            return sum(batch_size(b) for b in batch)  # a sink: a list of (x, y) batches
        return batch_size(first)
    return 0


def throughput_monitor(steps_per_epoch: int | None = None) -> ThroughputMonitor:
    """Lightning's ``ThroughputMonitor`` counting samples with :func:`batch_size`.

    It logs ``train/device/samples_per_sec`` (and, with more than one process,
    ``train/samples_per_sec`` over all ranks; validation time excluded) to the loggers every
    ``log_every_n_steps`` once its window of training batches is full; nothing without a
    logger. No FLOPs: lit_amp's LitModel has no ``flops_per_batch``.

    Args:
        steps_per_epoch: training batches per epoch; the window is that many (2 to
            :data:`THROUGHPUT_WINDOW`), so a short run still measures.

    Returns:
        The callback.

    Example:
        >>> throughput_monitor(8).kwargs
        {'window_size': 8}
    """
    window = THROUGHPUT_WINDOW if steps_per_epoch is None else steps_per_epoch
    return ThroughputMonitor(batch_size_fn=batch_size,
                             window_size=max(2, min(THROUGHPUT_WINDOW, int(window))))


def _split_data(loaders: Any) -> tuple[Any, Any]:
    if isinstance(loaders, Mapping):
        train = loaders.get("train")
        valid = loaders.get("valid", loaders.get("val", loaders.get("test")))
        return train, valid
    if isinstance(loaders, (tuple, list)) and 1 <= len(loaders) <= 3:
        return loaders[0], (loaders[1] if len(loaders) > 1 else None)
    return loaders, None


def _metrics(node: Any, make: Make) -> Any:
    """``[acc, loss]`` -> a set of names; ``{name: name | metric node}`` -> name -> Metric."""
    if node is None:
        return None
    if isinstance(node, ListConfig) or isinstance(node, (list, tuple)):
        return {str(n) for n in node}
    if isinstance(node, (DictConfig, Mapping)):
        from lit_amp.metrics import get_metric_fn

        out = {}
        for key, value in node.items():
            if isinstance(value, (DictConfig, Mapping)) and "_target_" in value:
                out[str(key)] = make(value, f"model.metrics.{key}")
            else:
                out[str(key)] = get_metric_fn(str(value))
        return out
    return {str(node)}


def _fill_steps_per_epoch(node: Any, steps: int | None) -> None:
    """Set every ``steps_per_epoch: null`` below ``node`` (THOR's schedules) to ``steps``."""
    if not isinstance(node, DictConfig) or steps is None:
        return
    for key in list(node.keys()):
        value = node._get_node(key)
        if key == "steps_per_epoch" and value._is_none():
            node[key] = int(steps)
        elif isinstance(value, DictConfig):
            _fill_steps_per_epoch(value, steps)


def _make_optimizer(factory: Any, network: Any) -> Any:
    """Call an optimizer factory with the network (THOR: ``thor(net, ...)``) or its parameters."""
    func = factory.func if isinstance(factory, functools.partial) else factory
    try:
        first = next(iter(inspect.signature(func).parameters), "")
    except (TypeError, ValueError):
        first = ""
    if first in ("net", "network", "model", "module"):
        return factory(network)
    return factory(network.parameters())


def _trainer_kwargs(cfg: DictConfig, make: Make) -> dict:
    node = cfg.get("trainer")
    if node is None:
        kw: dict = {}
    elif "_target_" in node:
        kw = dict(make(node, "trainer", _partial_=True).keywords)
    else:
        kw = dict(_plain(node))
    kw = torchrun_trainer_kwargs({k: v for k, v in kw.items() if v is not None})
    kw = preemption.trainer_kwargs(kw)  # under SLURM: no Lightning auto-requeue
    if kw.get("enable_progress_bar") and piped():
        kw["enable_progress_bar"] = False  # no redraw frames in a pipe: EpochLine prints instead
    loggers = [
        _logger(n, k, make)
        for k, n in (cfg.get("logger") or {}).items()
        if n is not None and "_target_" in n
    ]
    params = hyperparameters(cfg)
    for lg in loggers:
        lg.log_hyperparams(params)
    kw["logger"] = loggers if loggers else False
    return kw


def _logger(node: Any, key: str, make: Make) -> Any:
    """One logger; a missing package is named with the lit_amp extra that installs it."""
    try:
        return make(node, f"logger.{key}")
    except Exception as exc:
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, ImportError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        extra = key if key in ("tensorboard", "wandb", "mlflow") else None
        hint = f"pip install 'lit_amp[{extra}]'" if extra else "install its package"
        raise ConfigError(
            f"lit-amp: logger '{key}' ({node.get('_target_')}) needs a package that is not "
            f"installed ({cause}): {hint}, or choose another logger (logger=csv)."
        ) from exc


def hyperparameters(cfg: DictConfig) -> dict:
    """The run's configuration as the loggers' hyper-parameters (``hparams.yaml``).

    Everything but Hydra's own node and ``paths``, resolved, plus ``tags``.

    Args:
        cfg: the composed config.

    Returns:
        A nested dict of plain values.
    """
    from omegaconf import OmegaConf

    params: dict = {}
    for key in cfg:
        if key in ("hydra", "paths"):
            continue
        try:
            value = _plain(cfg[key])
            params[key] = _name(value) if isinstance(value, Enum) else value
        except Exception:  # noqa: BLE001 - an interpolation that resolves only inside a run
            node = cfg._get_node(key)
            params[key] = (OmegaConf.to_container(node, resolve=False, enum_to_str=True)
                           if isinstance(node, (DictConfig, ListConfig)) else str(node))
    return params


@contextlib.contextmanager
def _building(key: str) -> Iterator[None]:
    """Report a value that a constructor rejects as a :class:`ConfigError` naming ``key``."""
    try:
        yield
    except CompactHydraException:
        raise
    except (TypeError, ValueError, NotImplementedError, ImportError) as exc:
        raise ConfigError(
            f"lit-amp: the configuration of '{key}' was rejected: {type(exc).__name__}: {exc}\n"
            "(see the composed config with `lit-amp --cfg job`; HYDRA_FULL_ERROR=1 for the "
            "traceback)"
        ) from exc


def _validate(cfg: DictConfig) -> None:
    """Range checks the schema's types cannot express (bad values fail before any work).

    The checks are :func:`lit_amp.cli.precheck.check_config`'s, which ``lit-amp`` runs before
    torch is imported outside a sweep; here a job of a ``-m`` sweep gets the same messages.
    """
    check_config(cfg)


def _steps_per_epoch(cfg: DictConfig, train: Any) -> int | None:
    """Training steps per epoch: ``sink_size`` in sink mode, else ``len(train)`` if it has one."""
    if cfg.dataset_sink_mode and cfg.sink_size > 0:
        return int(cfg.sink_size)
    if hasattr(train, "__len__"):
        with contextlib.suppress(TypeError):
            return len(train)
    return None


def _optimizer(cfg: DictConfig, make: Make, network: Any, steps: int | None) -> Any:
    """The optimizer node built for ``network`` (THOR's schedules get ``steps``), or None."""
    if cfg.get("optimizer") is None:
        return None
    _fill_steps_per_epoch(cfg.optimizer, steps)
    factory = make(cfg.optimizer, "optimizer")
    with _building("optimizer"):
        return _make_optimizer(factory, network)


def _model_kwargs(cfg: DictConfig, make: Make) -> dict[str, Any]:
    """MindSpore's Model kwargs: loss_scale_manager, keep_batchnorm_fp32, boost_config_dict."""
    kw: dict[str, Any] = {}
    ls = cfg.get("loss_scale")
    if ls is not None and "_target_" in ls:
        kw["loss_scale_manager"] = make(ls, "loss_scale")
    elif ls is not None and ls.get("enabled", True) is False:
        kw["loss_scale_manager"] = None
    if cfg.amp.get("keep_batchnorm_fp32") is not None:
        kw["keep_batchnorm_fp32"] = bool(cfg.amp.keep_batchnorm_fp32)
    if _name(cfg.boost.level) != "O0" and cfg.boost.get("config") is not None:
        kw["boost_config_dict"] = _plain(cfg.boost.config)
    return kw


def _model(cfg: DictConfig, parts: dict[str, Any], trainer_kwargs: dict,
           model_kwargs: dict) -> Any:
    """The Model (RecModel online; converted to a ThorModel for a THOR optimizer)."""
    amp_level = _name(cfg.amp.level)
    with _building("amp / loss_scale / boost / model"):
        if _name(cfg.mode) == "online":
            from lit_amp.rec import RecModel as model_cls
        else:
            from lit_amp import Model as model_cls
        model = model_cls(
            parts["network"], parts["loss_fn"], parts["optimizer"], metrics=parts["metrics"],
            amp_level=amp_level, boost_level=_name(cfg.boost.level), trainer=trainer_kwargs,
            **model_kwargs,
        )
        from lit_amp.thor import THOR, ConvertModelUtils

        if isinstance(parts["optimizer"], THOR):
            kbn = model_kwargs.get("keep_batchnorm_fp32", amp_level in ("O2", "auto"))
            model = ConvertModelUtils.convert_to_thor_model(
                model, **parts, amp_level=amp_level,
                loss_scale_manager=model_kwargs.get("loss_scale_manager"),
                keep_batchnorm_fp32=kbn,
            )
    return model


def build(cfg: DictConfig) -> Built:
    """Build data, network, optimizer, callbacks and the Model from a composed config.

    Args:
        cfg: a config composed from ``conf/`` (``hydra.compose`` or ``lit-amp``).

    Returns:
        A :class:`Built`.

    Raises:
        hydra.errors.InstantiationException: a ``_target_`` failed (Hydra's message, naming the
            config key).
        ConfigError: a lit_amp class rejected a configured value.
    """
    _validate(cfg)
    trusted = [*(str(p) for p in (cfg.get("extra_trusted_targets") or [])),
               *current_grants().targets]  # LIT_AMP_TRUSTED_TARGETS
    for key in cfg:  # every target is checked before anything is built
        if key != "hydra":
            check_targets(cfg._get_node(key), trusted, str(key))
    online = _name(cfg.mode) == "online"

    def make(node: Any, key: str, *args: Any, **kw: Any) -> Any:
        with _building(key):
            return instantiate(node, *args, trusted=trusted, **kw)

    data = make(cfg.data, "data")
    train, valid = (data, None) if online else _split_data(data)
    mcfg = cfg.model
    network = make(mcfg.network, "model.network")
    loss_fn = make(mcfg.loss_fn, "model.loss_fn") if mcfg.get("loss_fn") is not None else None
    with _building("model.metrics"):
        metrics = _metrics(mcfg.get("metrics"), make)
    steps = _steps_per_epoch(cfg, train) if cfg.get("optimizer") is not None or not online else None
    optimizer = _optimizer(cfg, make, network, steps)
    model_kwargs = _model_kwargs(cfg, make)
    callbacks = [
        make(n, f"callbacks.{k}") for k, n in (cfg.get("callbacks") or {}).items() if n is not None
    ]
    callbacks += preemption.callbacks()  # a SLURM launcher job: stop at a step on a signal
    trainer_kwargs = _trainer_kwargs(cfg, make)
    if any(isinstance(cb, LightningModelCheckpoint) for cb in callbacks):
        trainer_kwargs["enable_checkpointing"] = True  # Model's default (False) would refuse it
    if not online:
        callbacks.append(throughput_monitor(steps))
    parts = {"network": network, "loss_fn": loss_fn, "optimizer": optimizer, "metrics": metrics}
    model = _model(cfg, parts, trainer_kwargs, model_kwargs)
    return Built(model, network, loss_fn, optimizer, metrics, train, valid, callbacks,
                 trainer_kwargs, model_kwargs)
