"""A sink's training steps as one CUDA graph, replayed per batch (``LitModel.sink_graph``).

In sink mode (``Model.train(..., dataset_sink_mode=True)``) a Lightning step runs ``sink_size``
train steps. On CUDA a small network is bound by the host (Python and kernel launches), so
``LitModel`` captures one train step as a ``torch.cuda.CUDAGraph`` and replays it for each
batch: the batch is copied into static input buffers and the whole step (forward, loss,
backward, gradient clipping, optimizer update) is one launch. The losses and weights are those
of eager training.

When: ``LitModel.sink_graph`` is ``False`` / ``"off"`` (the default: never), ``"auto"``
(capture on CUDA when allowed) or ``True`` (capture or raise a RuntimeError naming the
reason). It is opt-in because Python in a forward runs once, at capture (Limits, below): turn
it on for a network whose forward, like one written for MindSpore's graph mode, keeps no
host-side state.
The first 3 steps of a ``train`` call run eagerly on a side stream (warm-up: real training
steps, counted as eager); the next batch is captured and replayed, the later ones are
replayed. The graph is kept across the sinks of one ``train`` call and released at its end.
It is captured again (no warm-up) when something it baked in changed between sinks: the
optimizer's hyperparameters (an LR schedule), its parameters or state tensors, the modules'
train/eval modes, ``requires_grad`` flags or the clipping settings.

Refused (the sink trains eagerly, as before; the reason is logged once per call at INFO and in
``LitModel.sink_graph_status``): a device other than CUDA; no optimizer; loss scaling (its
overflow check reads the device every step: pass ``loss_scale_manager=None``); gradient
accumulation; more than one process (DDP, FSDP2); a strategy or precision plugin other than
Lightning's single-device defaults, anomaly detection, or a callback with a gradient hook; an
optimizer other than ``torch.optim.SGD`` and ``Adam``/``AdamW`` built with ``capturable=True``
(so THOR too), one with step hooks, tensor-valued hyperparameters or ``differentiable=True``;
``boost_level`` other than ``"O0"`` or a boost callback; forward or backward hooks on the
network, the loss or their parameters other than lit_amp's AMP casts (their Python would run
once, at capture); a network with active dropout,
``RReLU``, ``BatchNorm(momentum=None)`` or sparse embeddings; a train step that draws random
numbers (checked during the warm-up); a ``LitModel`` subclass that overrides
``train_one_step`` (or the gradient clipping, when clipping is on). A capture that fails (a
host synchronisation in the step, such as ``.item()``) or in which the optimizer creates
state (a parameter's first gradient) falls back to eager training for the rest of the call.

Per batch: a batch whose tensors differ from the captured one in shape, dtype, strides or
device (the last partial batch of a dataset) runs eagerly, as does a batch with values other
than CUDA tensors; both are counted in ``eager_steps``. AMP levels O1-O3 work: while a graph is
in use the low-precision parameter copies are cast at every step instead of being cached
(same values), because a replayed update does not bump the version counters the cache reads.

Limits: Python code in the forward runs once, at capture; its kernels are replayed. A
forward that branches on a host-side counter, or replaces tensors kept as plain attributes
(not parameters or buffers) between sinks, must turn the graph off (``sink_graph=False``).
``LitModel.sink_graph_status`` is ``{"captured", "reason", "replayed_steps", "eager_steps",
"captures"}`` for the latest ``train`` call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn

from lit_amp._validation import type_error, value_error
from lit_amp.model._lightning import fast_path_ok

__all__ = ["SinkGraph", "SinkGraphPlan", "check_sink_graph", "plan_sink_graph", "WARMUP_STEPS"]

log = logging.getLogger(__name__)

#: the torch.cuda API the runner calls (one name, so that a test can stand in for it on CPU)
_cuda: Any = torch.cuda

#: eager steps (on a side stream) before the capture: lazy initialisation (optimizer state,
#: cuBLAS handles, autotuning) must not happen inside the graph (torch's recipe uses 3)
WARMUP_STEPS = 3


def check_sink_graph(value: Any) -> bool | str:
    """Validate a ``LitModel.sink_graph`` setting.

    Args:
        value: ``"auto"``, ``True``, ``False`` or ``"off"``.

    Returns:
        ``value``.

    Raises:
        TypeError: ``value`` is neither a bool nor a str.
        ValueError: a str other than ``"auto"`` and ``"off"``.

    Example:
        >>> check_sink_graph("auto")
        'auto'
    """
    if not isinstance(value, (bool, str)):
        raise type_error("LitModel", "sink_graph", "True, False, 'auto' or 'off'", value)
    if isinstance(value, str) and value not in ("auto", "off"):
        raise value_error("LitModel", "sink_graph", "True, False, 'auto' or 'off'", value)
    return value


@dataclass(frozen=True)
class SinkGraphPlan:
    """Whether a sink's train step may be captured as a CUDA graph.

    Attributes:
        capture: True when capture is allowed.
        reason: empty when allowed; otherwise what prevents it and what to change.
    """

    capture: bool
    reason: str = ""


def _optimizer_reasons(opt: torch.optim.Optimizer) -> list[str]:
    """Why the step of ``opt`` cannot be captured (empty: it can)."""
    from torch.optim import SGD, Adam, AdamW
    from torch.optim import optimizer as optim_mod

    kind = type(opt)
    name = kind.__name__
    if name == "THOR" or ".thor" in kind.__module__:
        return ["THOR alternates first- and second-order steps with host-side counters: "
                "train it with sink_graph=False"]
    if kind not in (SGD, Adam, AdamW):
        return [f"the optimizer {kind.__module__}.{name} is not known to be capture-safe "
                "(allowed: torch.optim.SGD, and Adam/AdamW with capturable=True)"]
    out = []
    groups = opt.param_groups
    if kind in (Adam, AdamW) and not all(g.get("capturable", False) for g in groups):
        out.append(f"{name} keeps its step count on the host: construct "
                   f"{name}(..., capturable=True)")
    for i, g in enumerate(groups):
        if g.get("differentiable", False):
            out.append(f"param group {i} has differentiable=True: use differentiable=False")
        tensors = sorted(k for k, v in g.items() if k != "params" and torch.is_tensor(v))
        if tensors:
            out.append(f"param group {i} holds {', '.join(tensors)} as a tensor: pass a float")
    hooks = (opt._optimizer_step_pre_hooks, opt._optimizer_step_post_hooks,
             optim_mod._global_optimizer_pre_hooks, optim_mod._global_optimizer_post_hooks)
    if any(len(h) for h in hooks):
        out.append("optimizer step hooks are registered (Python run at every step)")
    return out


def _module_reasons(*modules: nn.Module | None) -> list[str]:
    """Modules whose training step is not graph-safe (random numbers, host reads, sparse)."""
    found: list[str] = []
    for root in modules:
        if root is None:
            continue
        for name, m in root.named_modules():
            label = f"{type(m).__name__} at {name or '<root>'!r}"
            if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 and m.training:
                found.append(f"{label} (p={m.p}) draws random numbers")
            elif isinstance(m, nn.RReLU) and m.training:
                found.append(f"{label} draws random numbers")
            elif isinstance(m, nn.MultiheadAttention) and m.dropout > 0 and m.training:
                found.append(f"{label} (dropout={m.dropout}) draws random numbers")
            elif (isinstance(m, nn.modules.batchnorm._BatchNorm) and m.momentum is None
                  and m.track_running_stats and m.training):
                found.append(f"{label} with momentum=None reads its batch count on the host")
            elif isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse:
                found.append(f"{label} has sparse gradients")
    if not found:
        return []
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    return ["the network is not graph-safe: " + "; ".join(found[:3]) + more
            + " (put those modules in eval mode, or use sink_graph=False)"]


def _is_amp_hook(hook: Any) -> bool:
    """lit_amp's own casting hooks (deterministic: they only choose dtypes)."""
    return type(hook).__module__ == "lit_amp.amp.hooks"


def _hook_reasons(*modules: nn.Module | None) -> list[str]:
    """Module and parameter hooks other than lit_amp's casts: Python the graph would not rerun."""
    from torch.nn.modules import module as module_mod

    found: list[str] = []
    for root in modules:
        if root is None:
            continue
        for name, m in root.named_modules():
            hooks = [*m._forward_pre_hooks.values(), *m._forward_hooks.values(),
                     *m._backward_pre_hooks.values(), *m._backward_hooks.values()]
            if any(not _is_amp_hook(h) for h in hooks):
                found.append(f"{type(m).__name__} at {name or '<root>'!r}")
        for pname, p in root.named_parameters():
            if getattr(p, "_backward_hooks", None) or getattr(
                    p, "_post_accumulate_grad_hooks", None):
                found.append(f"parameter {pname!r}")
    glob = [module_mod._global_forward_pre_hooks, module_mod._global_forward_hooks,
            module_mod._global_backward_pre_hooks, module_mod._global_backward_hooks]
    if any(len(h) for h in glob):
        found.append("global module hooks (torch.nn.modules.module.register_module_*)")
    if not found:
        return []
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    return ["hooks would run once, at capture, not at every step: " + "; ".join(found[:3])
            + more + " (remove them, or use sink_graph=False)"]


def _trainer_reasons(trainer: Any) -> list[str]:
    out = []
    world = int(getattr(trainer, "world_size", 1) or 1)
    if world > 1:
        out.append(f"training runs in {world} processes (DDP/FSDP2 reduce gradients between "
                   "ranks): train on one device")
    if getattr(trainer, "_detect_anomaly", False):
        out.append("Trainer(detect_anomaly=True) checks every gradient on the host")
    if world == 1 and hasattr(trainer, "strategy") and not fast_path_ok(trainer):
        out.append(
            f"the strategy {type(trainer.strategy).__name__} / precision plugin "
            f"{type(trainer.strategy.precision_plugin).__name__} or a callback with a "
            "gradient hook (on_before_backward, on_after_backward, on_before_optimizer_step, "
            "on_before_zero_grad) runs Python at every step: use Lightning's single-device "
            "defaults (lit_amp's amp_level for mixed precision)"
        )
    from lit_amp.boost.auto_boost import AutoBoost
    from lit_amp.boost.base import BoostAlgorithm

    boost = [type(cb).__name__ for cb in getattr(trainer, "callbacks", [])
             if isinstance(cb, (AutoBoost, BoostAlgorithm))]
    if boost:
        out.append(f"boost callbacks ({', '.join(boost)}) act at every step: remove them")
    return out


def plan_sink_graph(lit: Any, device: torch.device | str, *, setting: bool | str | None = None,
                    trainer: Any = None) -> SinkGraphPlan:
    """Decide, from facts known on the host, whether a sink's train step may be captured.

    Args:
        lit: the :class:`~lit_amp.model.lit_model.LitModel`.
        device: the device the step runs on (``torch.device("cuda")`` can be planned for
            without a GPU).
        setting: the ``sink_graph`` setting; None: ``lit.sink_graph``.
        trainer: the Trainer of the run; None: the one ``lit`` is attached to, if any.

    Returns:
        The :class:`SinkGraphPlan`; every reason found is listed, separated by ``"; "``.

    Example:
        >>> from lit_amp.model.lit_model import LitModel
        >>> net = nn.Linear(4, 2)
        >>> lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1))
        >>> plan_sink_graph(lit, torch.device("cuda")).reason
        'sink_graph=False turns capture off'
        >>> lit.sink_graph = "auto"
        >>> plan_sink_graph(lit, torch.device("cuda"))
        SinkGraphPlan(capture=True, reason='')
        >>> plan_sink_graph(lit, "cpu").reason
        "the device is 'cpu': CUDA graphs need a CUDA device"
    """
    from lit_amp.model.lit_model import LitModel

    setting = lit.sink_graph if setting is None else check_sink_graph(setting)
    if setting in (False, "off"):
        return SinkGraphPlan(False, f"sink_graph={setting!r} turns capture off")
    device = torch.device(device)
    reasons = []
    if device.type != "cuda":
        reasons.append(f"the device is {device.type!r}: CUDA graphs need a CUDA device")
    opt = lit.optimizer
    if opt is None:
        reasons.append("there is no optimizer (optimizer=None: the network updates itself); "
                       "pass a torch optimizer")
    else:
        reasons.extend(_optimizer_reasons(opt))
    if not lit._amp_applied and (lit.amp_level != "O0" or lit.amp_kwargs):
        reasons.append(f"amp_level={lit.amp_level!r} is not applied yet (apply_amp)")
    if lit.loss_scale is not None and lit.loss_scale.enabled:
        reasons.append("loss scaling is on (its overflow check reads the device every step): "
                       "pass loss_scale_manager=None, or use amp_level 'O1'/'O3' or bfloat16")
    if trainer is None:
        trainer = getattr(lit, "_trainer", None)
    n = max(lit.grad_accumulation_steps, lit._trainer_grad["accumulate"],
            int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
    if n > 1:
        reasons.append(f"gradient accumulation over {n} batches steps every {n}th batch: "
                       "accumulate_grad_batches / grad_accumulation_step must be 1")
    if any(config.interval == "step" for config, *_ in lit.__dict__.get("_lr_plan", ())):
        reasons.append("a step-interval LR scheduler changes the learning rate between steps "
                       "(a captured step would keep the first one): use an 'epoch' interval")
    if lit.boost_level != "O0" or lit.boost is not None:
        reasons.append(f"boost_level={lit.boost_level!r} acts at every step: use 'O0'")
    if type(lit).train_one_step is not LitModel.train_one_step:
        reasons.append(f"{type(lit).__name__} overrides train_one_step (the captured step "
                       "would not be yours)")
    if lit._trainer_grad["clip_val"] and (
        type(lit).configure_gradient_clipping is not LitModel.configure_gradient_clipping
    ):
        reasons.append(f"{type(lit).__name__} overrides configure_gradient_clipping")
    if torch.is_anomaly_enabled():
        reasons.append("autograd anomaly detection is on (it reads every gradient)")
    reasons.extend(_module_reasons(lit.network, lit.loss_fn))
    reasons.extend(_hook_reasons(lit.network, lit.loss_fn))
    if trainer is not None:
        reasons.extend(_trainer_reasons(trainer))
    return SinkGraphPlan(not reasons, "; ".join(reasons))


# ----------------------------------------------------------------------------- batches
def _signature(batch: Any, leaves: list[torch.Tensor], device: torch.device) -> Any:
    """A comparable description of ``batch`` (its tensors appended to ``leaves``); None when
    it holds something other than CUDA tensors on ``device`` and plain constants."""
    if torch.is_tensor(batch):
        if batch.device != device or batch.requires_grad or batch.is_sparse:
            return None
        leaves.append(batch)
        return (batch.shape, batch.dtype, batch.stride())
    if isinstance(batch, (tuple, list)):
        parts = []
        for item in batch:
            sig = _signature(item, leaves, device)
            if sig is None:
                return None
            parts.append(sig)
        return (type(batch), tuple(parts))
    if isinstance(batch, dict):
        parts = []
        for key, item in batch.items():
            sig = _signature(item, leaves, device)
            if sig is None:
                return None
            parts.append((key, sig))
        return (type(batch), tuple(parts))
    if batch is None or isinstance(batch, (bool, int, float, str)):
        return ("const", type(batch), batch)  # baked into the graph: must stay equal
    return None


def _rebuild(batch: Any, tensors: Any) -> Any:
    """``batch``'s structure with its tensors taken, in order, from the iterator ``tensors``."""
    return apply_to_collection(batch, torch.Tensor, lambda _: next(tensors))


# ----------------------------------------------------------------------------- runner
def _released() -> None:
    return None


def _state_ids(state: Any) -> dict:
    """Which objects an optimizer's state holds, per parameter and key."""
    return {id(p): {k: id(v) for k, v in s.items()} for p, s in state.items()}


def _hyper(value: Any) -> Any:
    """A comparable stand-in for an optimizer hyperparameter or state value."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if torch.is_tensor(value):
        return ("tensor", id(value), value.data_ptr())
    if isinstance(value, (list, tuple)):
        return tuple(_hyper(v) for v in value)
    return ("object", type(value).__name__, id(value))


class SinkGraph:
    """Runs the sinks of one ``train`` call: eagerly, or through one captured CUDA graph.

    ``LitModel`` makes one per ``train`` call (at the first sink) and releases it when
    training ends. The module docstring gives the rules.

    Args:
        lit: the :class:`~lit_amp.model.lit_model.LitModel`.
        device: the device of the training steps.

    Example:
        >>> from lit_amp.model.lit_model import LitModel
        >>> net = nn.Linear(4, 2)
        >>> lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1))
        >>> runner = SinkGraph(lit, torch.device("cpu"))
        >>> runner.status["captured"], runner.status["reason"]
        (False, 'no sink has run')
    """

    def __init__(self, lit: Any, device: torch.device) -> None:
        self._lit = lit
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", _cuda.current_device())
        self._device = device
        #: CUDA: plan again when what the graph bakes in changes (elsewhere: plan once)
        self._watch = device.type == "cuda"
        self._plan: SinkGraphPlan | None = None
        self._setting: bool | str | None = None  # lit.sink_graph when last planned
        self._fingerprint: Any = None
        self._warm = 0
        self._graph: Any = None
        self._static_leaves: list[torch.Tensor] = []
        self._static_loss: torch.Tensor | None = None
        self._static_grads: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._grads_moved = False
        self._sig: Any = None
        self._side: Any = None
        self._capture_stream: Any = None
        self._amp_states: list[Any] = []
        self._notes: list[str] = []
        self._counts = {"replayed_steps": 0, "eager_steps": 0, "captures": 0}
        self._partial = 0
        self._failed: str | None = None  # a failed capture: no other one in this train call
        self._raw: Any = None  # the torch optimizer the captured step updates

    def __reduce__(self) -> tuple:
        # a deep copy or pickle of the LitModel during training carries no graph
        return (_released, ())

    # ------------------------------------------------------------------ status
    @property
    def status(self) -> dict[str, Any]:
        """``{"captured", "reason", "replayed_steps", "eager_steps", "captures"}``.

        ``reason`` says why steps ran eagerly (empty when none did but the warm-up);
        ``eager_steps`` counts the warm-up steps too.
        """
        notes = list(self._notes)
        if self._partial:
            notes.append(f"{self._partial} batch(es) differed from the captured one in shape, "
                         "dtype or layout (such as a last partial batch) and ran eagerly")
        if self._plan is None:
            notes = notes or ["no sink has run"]
        return {"captured": self._counts["captures"] > 0, "reason": "; ".join(notes),
                **self._counts}

    def _note(self, reason: str) -> None:
        if reason and reason not in self._notes:
            self._notes.append(reason)
            log.info("Sink steps run eagerly (no CUDA graph): %s", reason)

    # ------------------------------------------------------------------ planning
    def _snapshot(self) -> Any:
        """What a captured step bakes in, beyond the batch (a change: plan and capture again)."""
        lit = self._lit
        opt = lit.optimizer
        groups = []
        if opt is not None:
            state = opt.state
            for g in opt.param_groups:
                hyper = tuple((k, _hyper(v)) for k, v in g.items() if k != "params")
                params = tuple(
                    (id(p), p.data_ptr(), p.requires_grad,
                     tuple((k, _hyper(v)) for k, v in state.get(p, {}).items()))
                    for p in g["params"]
                )
                groups.append((hyper, params))
        net = lit.network
        modes = tuple(m.training for m in net.modules())
        if isinstance(lit.loss_fn, nn.Module):
            modes += tuple(m.training for m in lit.loss_fn.modules())
        buffers = tuple((id(b), b.data_ptr()) for b in net.buffers())
        grad = lit._trainer_grad
        return (lit.sink_graph, id(opt), tuple(groups), modes, buffers,
                grad["clip_val"], grad["clip_algorithm"], grad["accumulate"],
                lit.grad_accumulation_steps, lit._fast, lit.boost_level,
                lit.loss_scale is not None and lit.loss_scale.enabled)

    def _replan(self) -> None:
        self._drop_graph()
        plan = plan_sink_graph(self._lit, self._device)
        if plan.capture and self._failed is not None:
            plan = SinkGraphPlan(False, self._failed)
        if plan.capture and not self._lit._fast:  # the captured step is the fast path's
            plan = SinkGraphPlan(False, "Lightning's per-step wrappers are in use (not the "
                                        "single-device fast path)")
        self._plan = plan
        if not plan.capture:
            self._refuse(plan.reason)
        elif not self._amp_states:
            self._cast_every_step()

    def _refuse(self, reason: str) -> None:
        self._plan = SinkGraphPlan(False, reason)
        self._drop_graph()
        if self._lit.sink_graph is True:
            raise RuntimeError(
                "LitModel.sink_graph=True asks to capture the sink's train step as a CUDA "
                f"graph, but it cannot be captured: {reason}. Set sink_graph='auto' to train "
                "eagerly instead."
            )
        self._note(reason)

    def _cast_every_step(self) -> None:
        """AMP: no cached low-precision copies while a graph may replay (see the module)."""
        from lit_amp.amp.casting import invalidate_cast_cache

        net = self._lit.network
        for m in net.modules():
            state = m.__dict__.get("_amp_state")
            if state is not None and getattr(state, "cache_casts", False):
                state.cache_casts = False
                self._amp_states.append(state)
        if self._amp_states:
            invalidate_cast_cache(net)

    # ------------------------------------------------------------------ running
    def run(self, steps: Any) -> dict[str, Any]:
        """Train on every batch of ``steps`` (one sink); returns the last step's outputs."""
        lit = self._lit
        setting = lit.sink_graph
        # off (the default): no fingerprint of the optimizer state per sink
        snap = self._snapshot() if self._watch and setting not in (False, "off") else None
        if (self._plan is None or setting != self._setting
                or (snap is not None and snap != self._fingerprint)):
            self._setting, self._fingerprint = setting, snap
            self._replan()
        if not self._plan.capture:
            out: dict[str, Any] = {}
            n = 0
            for b in steps:
                out = lit.train_one_step(b)
                n += 1
            self._counts["eager_steps"] += n
            if snap is not None:
                self._fingerprint = self._snapshot()  # the steps may have created state
            return out
        return self._run_graph(steps)

    def _run_graph(self, steps: Any) -> dict[str, Any]:
        lit = self._lit
        lopt = lit._lopt if lit._lopt is not None else lit.optimizers()
        counts = self._counts
        out: dict[str, Any] = {}
        replayed_last = False
        for b in steps:
            if not self._plan.capture:
                out, replayed_last = lit.train_one_step(b), False
                counts["eager_steps"] += 1
                continue
            if self._graph is None and self._warm < WARMUP_STEPS:
                out, replayed_last = self._warmup_step(b), False
                counts["eager_steps"] += 1
                continue
            leaves: list[torch.Tensor] = []
            sig = _signature(b, leaves, self._device)
            if self._graph is None:
                if sig is None:
                    self._note("a batch holds values other than tensors on "
                               f"{self._device} and constants")
                    out, replayed_last = self._eager_step(b), False
                    continue
                replayed_last = self._capture(b, leaves, sig, lopt)
                if not replayed_last:
                    out = self._eager_step(b)
                continue
            if sig is None or sig != self._sig:
                self._partial += 1
                out, replayed_last = self._eager_step(b), False
                continue
            for static, t in zip(self._static_leaves, leaves):
                static.copy_(t)
            self._replay(lopt)
            replayed_last = True
        if replayed_last:
            assert self._static_loss is not None
            out = {"loss": self._static_loss.clone()}
        self._fingerprint = self._snapshot()  # the step itself may have created state
        return out

    def _eager_step(self, batch: Any) -> dict[str, Any]:
        out = self._lit.train_one_step(batch)
        self._counts["eager_steps"] += 1
        if self._graph is not None:
            self._grads_moved = True  # .grad now holds this step's gradients
        return out

    def _replay(self, lopt: Any) -> None:
        if self._grads_moved:  # .grad shows the graph's gradients again (as eager would)
            for p, g in self._static_grads:
                p.grad = g
            self._grads_moved = False
        lopt._on_before_step()
        self._graph.replay()
        lopt._on_after_step()
        self._counts["replayed_steps"] += 1

    def _warmup_step(self, batch: Any) -> dict[str, Any]:
        """One eager train step on a side stream; refuses capture if it drew random numbers."""
        dev = self._device
        if self._side is None:
            self._side = _cuda.Stream(dev)
        cur = _cuda.current_stream(dev)
        cpu_rng, cuda_rng = torch.get_rng_state(), _cuda.get_rng_state(dev)
        self._side.wait_stream(cur)
        with _cuda.stream(self._side):
            out = self._lit.train_one_step(batch)
        cur.wait_stream(self._side)
        self._warm += 1
        if not (torch.equal(cpu_rng, torch.get_rng_state())
                and torch.equal(cuda_rng, _cuda.get_rng_state(dev))):
            self._refuse("the train step draws random numbers (dropout or another random "
                         "op): a graph would not reproduce eager training")
        return out

    def _capture(self, batch: Any, leaves: list[torch.Tensor], sig: Any, lopt: Any) -> bool:
        """Capture the step on ``batch`` and replay it once (that trains on ``batch``).

        Returns:
            True when the step ran by replay; False when capture failed (nothing trained).
        """
        raw = lopt.optimizer
        dev = self._device
        static = [torch.empty_like(t) for t in leaves]
        if any(s.stride() != t.stride() for s, t in zip(static, leaves)):
            self._partial += 1  # an overlapping/expanded layout: no static buffer for it
            return False
        for s, t in zip(static, leaves):
            s.copy_(t)
        static_batch = _rebuild(batch, iter(static))
        if self._capture_stream is None:
            self._capture_stream = _cuda.Stream(dev)
        graph = _cuda.CUDAGraph()
        raw.zero_grad(set_to_none=True)  # the gradients are allocated in the graph's pool
        state = {p: dict(s) for p, s in raw.state.items()}
        self._raw = raw
        try:
            with _cuda.device(dev), _cuda.graph(
                graph, stream=self._capture_stream, capture_error_mode="thread_local"
            ):
                static_loss = self._captured_step(static_batch)
        except Exception as err:  # e.g. a host read (.item()) in the step
            _cuda.synchronize(dev)
            raw.zero_grad(set_to_none=True)
            self._capture_stream = None  # never capture on a stream whose capture failed
            # the step's error, not the capture_end that failed after it (its context)
            cause = err.__context__ if isinstance(err.__context__, Exception) else err
            text = str(cause).strip()
            self._failed = (f"capturing the train step failed ({type(cause).__name__}: "
                            f"{text.splitlines()[0] if text else ''}); train with "
                            "sink_graph=False or remove the host read from the step")
            self._refuse(self._failed)
            return False
        if _state_ids(raw.state) != _state_ids(state):
            # optimizer state first made inside the graph (a parameter's first gradient):
            # a replay would initialise it again at every step; the capture trained nothing,
            # so the state goes back to what it was and the step runs eagerly
            graph.reset()
            raw.zero_grad(set_to_none=True)
            raw.state.clear()
            raw.state.update(state)
            self._failed = ("the optimizer created state during the capture (a parameter "
                            "received its first gradient there, after the warm-up)")
            self._refuse(self._failed)
            return False
        self._graph, self._static_leaves, self._sig = graph, static, sig
        self._static_loss = static_loss
        self._static_grads = [(p, p.grad) for g in raw.param_groups for p in g["params"]
                              if p.grad is not None]
        self._grads_moved = False
        self._counts["captures"] += 1
        self._replay(lopt)
        return True

    def _captured_step(self, static_batch: Any) -> torch.Tensor:
        """The step the graph records: what ``LitModel.train_one_step`` does when the plan
        allows capture (no accumulation, no loss scaling, the fast path), less the host-side
        bookkeeping of ``_optimizer_step``, which runs around every replay."""
        lit = self._lit
        raw = self._raw
        loss = lit.loss_of(static_batch)
        lit._backward(loss, sync=True)
        lit._clip(raw)
        raw.step()
        return loss.detach()

    def _drop_graph(self) -> None:
        if self._graph is None:
            return
        _cuda.synchronize(self._device)
        self._graph.reset()
        self._graph = None
        self._static_leaves, self._static_loss, self._static_grads = [], None, []
        self._sig = None
        opt = self._lit.optimizer
        if opt is not None:
            opt.zero_grad(set_to_none=True)  # drop the graph pool's gradients

    def release(self) -> None:
        """Free the graph and turn the AMP cast cache back on (training ended)."""
        if self._graph is not None:
            _cuda.synchronize(self._device)
            self._graph.reset()
            self._graph = None
            self._static_leaves, self._static_loss, self._static_grads = [], None, []
        if self._amp_states:
            from lit_amp.amp.casting import invalidate_cast_cache

            for state in self._amp_states:
                state.cache_casts = True
            self._amp_states = []
            invalidate_cast_cache(self._lit.network)  # replays bumped no version counter
        self._side = self._capture_stream = None
