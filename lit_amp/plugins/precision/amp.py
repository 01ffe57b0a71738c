"""``AmpPrecision``: MindSpore's mixed-precision levels as a Lightning precision plugin.

``Trainer(plugins=[AmpPrecision("O2")])`` computes exactly as ``auto_mixed_precision(net, "O2")``
in a raw PyTorch loop and as ``Model(..., amp_level="O2")``: the plugin resolves the level with
:func:`lit_amp.amp.levels.resolve_amp_config` on the trainer's device, converts the model in
place with :func:`lit_amp.amp.convert.apply_amp_config`, and finishes every scaled step with
:meth:`~lit_amp.amp.loss_scale.controller.LossScaleController.apply`, so any LightningModule
gets the same levels and loss scaling as ``Model``. What each hook does is in
docs/migration.md, "AmpPrecision, hook by hook".

Example:
    >>> import lightning.pytorch as pl
    >>> plugin = AmpPrecision("O2")
    >>> trainer = pl.Trainer(plugins=[plugin], accelerator="cpu", max_steps=1, logger=False,
    ...                      enable_checkpointing=False, enable_progress_bar=False,
    ...                      enable_model_summary=False)
    >>> trainer.precision_plugin is plugin
    True
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Generator
from typing import Any

import torch
from lightning.pytorch.plugins.precision import Precision
from torch import Tensor, nn
from torch.optim import Optimizer

from lit_amp._validation import check_bool
from lit_amp.amp.casting import O1FunctionMode
from lit_amp.amp.convert import apply_amp_config, split_amp_list
from lit_amp.amp.hooks import is_converted, is_metric
from lit_amp.amp.levels import (
    LOW_DTYPES,
    UNSET,
    AmpConfig,
    check_amp_overrides,
    resolve_amp_config,
    validate_amp_level,
)
from lit_amp.amp.lists import FP32_MODULES
from lit_amp.amp.loss_scale import LossScaleController, LossScaleManager

__all__ = ["AmpPrecision", "STATE_KEY", "CONVERSION_OPTIONS", "PLUGIN_OPTIONS"]

log = logging.getLogger(__name__)

#: Stable checkpoint key of the loss-scale state (``LossScaleController.STATE_KEY``).
STATE_KEY = "lit_amp_loss_scale"

_LOW = (torch.float16, torch.bfloat16)

#: Keyword options of the plugins that override the level's conversion (passed on to
#: :func:`~lit_amp.amp.levels.resolve_amp_config`), with their defaults.
CONVERSION_OPTIONS: dict[str, Any] = {
    "keep_batchnorm_fp32": None,
    "cast_model_type": None,
    "white_list": None,
    "black_list": None,
    "cache_casts": None,
}
#: Keyword options of the plugins' own behaviour, with their defaults.
PLUGIN_OPTIONS: dict[str, Any] = {
    "overflow_diagnostics": False,
    "max_consecutive_overflows": 1000,
    "log_loss_scale": True,
    "skip_scheduler_on_overflow": True,
}


def _module_device(module: nn.Module) -> torch.device:
    trainer = getattr(module, "_trainer", None)
    if trainer is not None:
        with contextlib.suppress(Exception):
            return trainer.strategy.root_device
    p = next(module.parameters(), None)
    if p is not None:
        return p.device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _fully_sharded(module: nn.Module) -> bool:
    """Whether FSDP2's ``fully_shard`` was applied to ``module`` or one of its submodules."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return False
    return any(isinstance(m, FSDPModule) for m in module.modules())


def _top_level_roots(module: nn.Module) -> list[nn.Module]:
    roots: list[nn.Module] = []

    def add(m: nn.Module) -> None:
        if isinstance(m, (nn.ModuleList, nn.ModuleDict)):
            for c in m.children():
                add(c)
        elif not isinstance(m, FP32_MODULES) and not is_metric(m):
            roots.append(m)

    for c in module.children():
        add(c)
    return roots


class _SkipAwareScheduler:
    """Proxy of a step-interval LR scheduler: a call right after a skipped step is dropped."""

    def __init__(self, scheduler: Any, plugin: _AmpPrecisionMixin) -> None:
        self.__dict__["_scheduler"] = scheduler
        self.__dict__["_plugin"] = plugin

    def step(self, *args: Any, **kwargs: Any) -> Any:
        if self._plugin._consume_skipped_step():
            log.debug("AmpPrecision: LR scheduler step dropped after an overflow-skipped step")
            return None
        return self._scheduler.step(*args, **kwargs)

    def state_dict(self) -> dict:
        return self._scheduler.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self._scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_scheduler"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._scheduler, name, value)

    def __repr__(self) -> str:
        return f"_SkipAwareScheduler({self._scheduler!r})"


class _AmpPrecisionMixin:
    """The shared implementation of :class:`AmpPrecision` and ``AmpFSDPPrecision``."""

    #: cache low-precision parameter copies between optimizer steps
    _cache_casts_default = True

    def _amp_init(
        self,
        level: str = "O2",
        *,
        dtype: torch.dtype | None = None,
        amp: AmpConfig | None = None,
        loss_scale: Any = UNSET,
        **options: Any,
    ) -> None:
        """Validate and store the arguments of ``__init__`` (shared by both plugins)."""
        name = type(self).__name__
        if "loss_scale_manager" in options:  # MindSpore's name for ``loss_scale``
            if loss_scale is not UNSET:
                raise TypeError(f"For '{name}', give 'loss_scale' or its alias "
                                "'loss_scale_manager', not both.")
            loss_scale = options.pop("loss_scale_manager")
        unknown = sorted(set(options) - set(CONVERSION_OPTIONS) - set(PLUGIN_OPTIONS))
        if unknown:
            allowed = ", ".join(["level", "dtype", "amp", "loss_scale", "loss_scale_manager",
                                 *CONVERSION_OPTIONS, *PLUGIN_OPTIONS])
            raise TypeError(f"For '{name}', unknown keyword argument(s) {unknown}; the allowed "
                            f"ones are: {allowed}.")
        conv = {**CONVERSION_OPTIONS, **{k: v for k, v in options.items()
                                         if k in CONVERSION_OPTIONS}}
        behaviour = {**PLUGIN_OPTIONS, **{k: v for k, v in options.items()
                                          if k in PLUGIN_OPTIONS}}
        if amp is not None:
            _check_resolved(name, amp, level, dtype, conv)
            level, dtype = amp.level, amp.dtype
        validate_amp_level(level, "level", name)
        manager = loss_scale
        if isinstance(loss_scale, LossScaleController):
            manager = loss_scale.manager
        elif loss_scale is not UNSET and loss_scale is not None and not isinstance(
            loss_scale, LossScaleManager
        ):
            check_amp_overrides(name, loss_scale_manager=loss_scale)  # duck-typed manager
        check_amp_overrides(name, dtype=dtype, keep_batchnorm_fp32=conv["keep_batchnorm_fp32"],
                            cast_model_type=conv["cast_model_type"])
        for key, functions in (("white_list", True), ("black_list", False)):
            if conv[key] is not None:
                split_amp_list(list(conv[key]), key, functions)
        for key in ("overflow_diagnostics", "log_loss_scale", "skip_scheduler_on_overflow"):
            check_bool(name, key, behaviour[key])
        self.level = level
        self.dtype = dtype
        self.keep_batchnorm_fp32 = conv["keep_batchnorm_fp32"]
        self.cast_model_type = conv["cast_model_type"]
        self.loss_scale_manager = manager
        self.white_list = None if conv["white_list"] is None else tuple(conv["white_list"])
        self.black_list = None if conv["black_list"] is None else tuple(conv["black_list"])
        self.overflow_diagnostics = behaviour["overflow_diagnostics"]
        self.max_consecutive_overflows = behaviour["max_consecutive_overflows"]
        self.log_loss_scale = behaviour["log_loss_scale"]
        self.skip_scheduler_on_overflow = behaviour["skip_scheduler_on_overflow"]
        cache = conv["cache_casts"]
        self.cache_casts = self._cache_casts_default if cache is None else bool(cache)
        self.config: AmpConfig | None = amp
        self.controller: Any = None
        self._injected = loss_scale if isinstance(loss_scale, LossScaleController) else None
        self.diagnostics: Any = None
        self._pending_state: dict | None = None
        self._pending_key: Any = None
        self._pending_overflow = False
        self._skipped_unconsumed = False
        guess = dtype or self.cast_model_type
        if guess not in LOW_DTYPES:
            guess = torch.float16 if torch.cuda.is_available() else torch.bfloat16
        if amp is not None:
            self._make_controller()
            self.precision = self._precision_string(amp.mechanism, amp.dtype)
        else:
            self.precision = self._precision_string(level, guess)  # refined in convert_module

    @staticmethod
    def _precision_string(mechanism: str, dtype: torch.dtype) -> str:
        if mechanism in ("O0", "none"):
            return "32-true"
        return "bf16-mixed" if dtype == torch.bfloat16 else "16-mixed"

    # ------------------------------------------------------------------ configuration
    def resolve(self, device: torch.device | str | None) -> AmpConfig:
        """Resolve (once) the level for ``device`` and build the loss-scale controller.

        Args:
            device: the device the module trains on.

        Returns:
            The resolved configuration (the ``amp`` given to the constructor, if any).
        """
        if self.config is None:
            self.config = resolve_amp_config(
                self.level,
                device=device,
                dtype=self.dtype,
                keep_batchnorm_fp32=self.keep_batchnorm_fp32,
                cast_model_type=self.cast_model_type,
                loss_scale_manager=self.loss_scale_manager,
                white_list=self.white_list,
                black_list=self.black_list,
                cache_casts=self.cache_casts,
            )
            self.precision = self._precision_string(self.config.mechanism, self.config.dtype)
            self._make_controller()
        return self.config

    def _make_controller(self) -> None:
        assert self.config is not None
        if self._injected is not None:
            self.controller = self._injected
        else:
            manager = self.config.loss_scale_manager
            if self.loss_scale_manager is not UNSET:
                manager = self.loss_scale_manager
            self.controller = LossScaleController(
                manager, max_consecutive_overflows=self.max_consecutive_overflows
            )
        if self._pending_state is not None:
            self.controller.load_state_dict(self._pending_state)
            self._pending_state = None

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Convert ``module`` in place for the level; returns the same object."""
        cfg = self.resolve(_module_device(module))
        if self.overflow_diagnostics and self.diagnostics is None:
            from lit_amp.amp.diagnostics import OverflowDiagnostics

            self.diagnostics = OverflowDiagnostics(module).attach()
            self.controller.diagnostics = self.diagnostics
        if is_converted(module):
            log.info("%s: the module is already converted by lit_amp; left as is.",
                     type(self).__name__)
            return module
        if cfg.level != "O0" and _fully_sharded(module):
            raise ValueError(
                f"For '{type(self).__name__}', the argument 'module' must be converted before "
                f"fully_shard (FSDP2), but configure_model already sharded it: level "
                f"{cfg.level!r} converted afterwards would cast parameters FSDP has resharded, "
                "and the model would silently stop learning. In configure_model call "
                f"lit_amp.auto_mixed_precision(module, {cfg.level!r}, cache_casts=False) "
                "before fully_shard (this plugin then keeps the conversion and does the loss "
                "scaling), or train a LitModel / Model with strategy='fsdp2'."
            )
        self._device_type = _module_device(module).type
        apply_amp_config(module, cfg, output_roots=_top_level_roots(module))
        return module

    def _o1_mode(self) -> Any:
        cfg = self.config
        if cfg is None or cfg.mechanism != "O1":
            return None
        if cfg.white_list is None:  # the built-in lists: the step runs in an autocast region
            device_type = self.__dict__.get("_device_type") or (
                "cuda" if torch.cuda.is_available() else "cpu")  # before convert_module
            return torch.autocast(device_type, dtype=cfg.dtype, cache_enabled=cfg.cache_casts)
        functions = frozenset(split_amp_list(list(cfg.white_list), "white_list", True)[1])
        return O1FunctionMode(cfg.dtype, functions) if functions else None

    @contextlib.contextmanager
    def forward_context(self) -> Generator[None, None, None]:
        """At O1, the step runs in a ``torch.autocast`` region of the level's dtype (a custom
        white list: its torch functions compute in the low dtype)."""
        mode = self._o1_mode()
        if mode is None:
            yield
        else:
            with mode:
                yield

    @contextlib.contextmanager
    def train_step_context(self) -> Generator[None, None, None]:
        if self.diagnostics is not None:
            self.diagnostics.reset()
        with self.forward_context():
            yield

    def convert_input(self, data: Any) -> Any:
        return data

    def tensor_init_context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def module_init_context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def connect(
        self, model: nn.Module, optimizers: list[Optimizer], lr_schedulers: list[Any]
    ) -> tuple[nn.Module, list[Optimizer], list[Any]]:
        """Guard step-interval LR schedulers against overflow-skipped steps."""
        if self.skip_scheduler_on_overflow and self.controller is not None and (
            self.controller.enabled and self.controller.drop_overflow_update
        ):
            for config in lr_schedulers:
                sched = getattr(config, "scheduler", None)
                if getattr(config, "interval", "epoch") == "step" and sched is not None and (
                    not isinstance(sched, _SkipAwareScheduler)
                ):
                    config.scheduler = _SkipAwareScheduler(sched, self)
        return super().connect(model, optimizers, lr_schedulers)

    def _consume_skipped_step(self) -> bool:
        skipped = self._skipped_unconsumed
        self._skipped_unconsumed = False
        return skipped

    # ------------------------------------------------------------------ loss scaling
    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 without loss scaling)."""
        return 1.0 if self.controller is None else float(self.controller.scale)

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped because of an overflow."""
        return 0 if self.controller is None else int(self.controller.skipped_steps)

    def _enabled(self) -> bool:
        return self.controller is not None and self.controller.enabled

    @staticmethod
    def _step_key(model: Any) -> Any:
        trainer = getattr(model, "_trainer", None)
        if trainer is None:
            return None
        with contextlib.suppress(Exception):
            return int(trainer.fit_loop.epoch_loop.total_batch_idx)
        return None

    def _flush(self, key: Any = "flush") -> None:
        """Apply the pending once-per-step update when a new step (``key``) starts."""
        if self._pending_key is not None and key != self._pending_key:
            overflow, self._pending_overflow = self._pending_overflow, False
            self._pending_key = None
            self.controller.update(overflow)

    def pre_backward(self, tensor: Tensor, module: Any) -> Tensor:
        if torch.is_tensor(tensor) and tensor.dtype in _LOW:
            tensor = tensor.float()
        if self._enabled():
            if not getattr(module, "automatic_optimization", True):
                self._flush(self._step_key(module))
            tensor = self.controller.scale_loss(tensor)
        return super().pre_backward(tensor, module)

    def clip_gradients(self, optimizer: Optimizer, clip_val: float = 0.0,
                       gradient_clip_algorithm: Any = None) -> None:
        if self._enabled() and clip_val and clip_val > 0:
            self.controller.unscale_(optimizer)  # no-op when already unscaled this step
        if gradient_clip_algorithm is None:
            super().clip_gradients(optimizer, clip_val)
        else:
            super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)

    def optimizer_step(
        self,
        optimizer: Any,
        model: Any,
        closure: Callable[[], Any],
        **kwargs: Any,
    ) -> Any:
        if not self._enabled():
            return super().optimizer_step(optimizer, model=model, closure=closure, **kwargs)
        if isinstance(optimizer, torch.optim.LBFGS):
            raise RuntimeError(
                f"{type(self).__name__}: loss scaling does not support the LBFGS optimizer "
                "(its step re-evaluates the closure)."
            )
        ctl = self.controller
        automatic = getattr(model, "automatic_optimization", True)
        key = None if automatic else self._step_key(model)
        if not automatic:
            self._flush(key)
        closure_result = closure()
        if closure_result is None and automatic:  # the backward was skipped: nothing to apply
            self._after_closure(model, optimizer)
            return closure_result
        # unscale before on_before_optimizer_step and clipping (Lightning's order); in manual
        # optimization the scale is updated once per training step, after all its optimizers
        scale_used = ctl.scale
        done = ctl.apply(
            optimizer,
            lambda: optimizer.step(**kwargs),
            before_step=lambda: self._after_closure(model, optimizer),
            update=automatic,
        )
        if done.overflow and self.diagnostics is not None:
            log.warning("%s: gradient overflow (loss scale %s); first non-finite layer: %s",
                        type(self).__name__, scale_used, self.diagnostics.first_nonfinite())
        if not automatic:
            self._pending_key = key
            self._pending_overflow = self._pending_overflow or done.overflow
            if key is None:  # no trainer loop to tell steps apart: update now
                self._flush()
        self._skipped_unconsumed = done.skipped
        self._log(model)
        return done.output

    def _log(self, model: Any) -> None:
        if not self.log_loss_scale or getattr(model, "_current_fx_name", None) is None:
            return
        try:
            model.log("loss_scale", float(self.controller.scale), on_step=True, on_epoch=False,
                      batch_size=1)
            model.log("skipped_steps", float(self.controller.skipped_steps), on_step=True,
                      on_epoch=False, batch_size=1)
        except Exception as exc:  # logging must never break a step
            log.debug("AmpPrecision: could not log the loss scale: %s", exc)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The loss-scale state (empty without loss scaling)."""
        if not self._enabled():
            return {}
        self._flush()
        return {STATE_KEY: self.controller.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = state_dict.get(STATE_KEY, state_dict) if state_dict else None
        if not state:
            return
        if self.controller is None:
            self._pending_state = state
        elif self.controller.enabled:
            self.controller.load_state_dict(state)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self._enabled():
            checkpoint[STATE_KEY] = self.controller.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if STATE_KEY in checkpoint:
            self.load_state_dict({STATE_KEY: checkpoint[STATE_KEY]})

    def teardown(self) -> None:
        if self._enabled():
            self._flush()
        super().teardown()


def _check_resolved(name: str, amp: Any, level: str, dtype: Any, conv: dict) -> None:
    """``amp`` (a resolved configuration) replaces the level, dtype and conversion options."""
    if not isinstance(amp, AmpConfig):
        raise TypeError(f"For '{name}', the argument 'amp' must be an AmpConfig (from "
                        f"resolve_amp_config) or None, but got {type(amp).__name__}.")
    given = [k for k in ("keep_batchnorm_fp32", "cast_model_type", "white_list", "black_list")
             if conv[k] is not None]
    if dtype is not None:
        given.append("dtype")
    if level != "O2":
        given.append("level")
    if given:
        raise ValueError(f"For '{name}', the argument 'amp' (a resolved AmpConfig) already fixes "
                         f"{given}; give either 'amp' or those arguments.")


class AmpPrecision(_AmpPrecisionMixin, Precision):
    """MindSpore's AMP levels (O0-O3, ``auto``) and loss scaling as a Lightning precision plugin.

    Like Lightning's ``MixedPrecision(precision, device, scaler)``, the plugin is composed: a
    level (or an already resolved :class:`~lit_amp.amp.levels.AmpConfig`) says how the module
    computes, and an injected loss-scale object says how the loss is scaled.

    Args:
        level: ``"O0"``, ``"O1"``, ``"O2"``, ``"O3"`` or ``"auto"``.
        dtype: low compute dtype; None -> float16 on CUDA, bfloat16 on CPU.
        amp: a configuration from :func:`~lit_amp.amp.levels.resolve_amp_config`, used as is
            (instead of ``level``, ``dtype`` and the conversion options).
        loss_scale: a :class:`~lit_amp.amp.loss_scale.managers.LossScaleManager` (the plugin
            builds its controller), a
            :class:`~lit_amp.amp.loss_scale.controller.LossScaleController` (used as is), or
            None (no scaling); by default the level's (O2 float16: ``DynamicLossScaleManager()``).
            ``loss_scale_manager=`` (MindSpore's name) is an alias.
        **options: conversion overrides (:data:`CONVERSION_OPTIONS`): ``keep_batchnorm_fp32``,
            ``cast_model_type`` (float32, float16 or bfloat16), ``white_list`` (O1) and
            ``black_list`` (O2) as in ``custom_mixed_precision``, ``cache_casts`` (cache
            low-precision parameter copies between optimizer steps); and the plugin's
            behaviour (:data:`PLUGIN_OPTIONS`): ``overflow_diagnostics`` (name the first
            non-finite layer on overflow; one extra pass per module output),
            ``max_consecutive_overflows`` (raise after this many overflowing steps in a row),
            ``log_loss_scale`` (log ``loss_scale`` and ``skipped_steps`` every optimizer step)
            and ``skip_scheduler_on_overflow`` (drop the step-interval LR scheduler call that
            follows an overflow-skipped step).

    Raises:
        TypeError: ``level`` not a str, ``keep_batchnorm_fp32`` not a bool, a wrong list
            element or manager, an unknown keyword (the message lists the allowed ones).
        ValueError: unknown level, ``dtype``/``cast_model_type`` not allowed, ``amp`` given
            together with the arguments it fixes.

    Example:
        >>> plugin = AmpPrecision("O3", dtype=torch.bfloat16)
        >>> plugin.precision
        'bf16-mixed'
        >>> from lit_amp.amp.levels import resolve_amp_config
        >>> from lit_amp.amp.loss_scale import FixedLossScaleManager, LossScaleController
        >>> ctl = LossScaleController(FixedLossScaleManager(2.0**10))
        >>> plugin = AmpPrecision(amp=resolve_amp_config("O2", device="cpu"), loss_scale=ctl)
        >>> plugin.controller is ctl, plugin.loss_scale
        (True, 1024.0)
    """

    def __init__(
        self,
        level: str = "O2",
        *,
        dtype: torch.dtype | None = None,
        amp: AmpConfig | None = None,
        loss_scale: LossScaleController | LossScaleManager | None = UNSET,
        **options: Any,
    ) -> None:
        super().__init__()
        self._amp_init(level, dtype=dtype, amp=amp, loss_scale=loss_scale, **options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(level={self.level!r}, precision={self.precision!r})"
