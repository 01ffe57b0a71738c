"""Whether a sink's train steps may run as one captured CUDA graph, decided on the host.

A captured step replays its kernels, not its Python: anything that runs host code, reads the
device or draws random numbers at every step would be frozen at capture. :func:`plan_sink_graph`
lists every such reason it can see before training (the device, the optimizer, the modules
and their hooks, the Trainer, and the model's own settings through
:meth:`~lit_amp.model.train_step.TrainStepMixin.capture_blockers`); the runner
(:mod:`lit_amp.model.graph_sink`) trains eagerly, or raises for ``sink_graph=True``, when any
is found. docs/differences.md ("Sink mode as a CUDA graph") lists the rules for users.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lit_amp._validation import type_error, value_error
from lit_amp.model._lightning import fast_path_ok

__all__ = ["SinkGraphPlan", "attached_trainer", "check_sink_graph", "plan_sink_graph"]


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
        lit: the :class:`~lit_amp.model.lit_model.LitModel` (its reasons:
            :meth:`~lit_amp.model.train_step.TrainStepMixin.capture_blockers`).
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
    setting = lit.sink_graph if setting is None else check_sink_graph(setting)
    if setting in (False, "off"):
        return SinkGraphPlan(False, f"sink_graph={setting!r} turns capture off")
    device = torch.device(device)
    if trainer is None:
        trainer = attached_trainer(lit)
    reasons = []
    if device.type != "cuda":
        reasons.append(f"the device is {device.type!r}: CUDA graphs need a CUDA device")
    opt = lit.optimizer
    if opt is None:
        reasons.append("there is no optimizer (optimizer=None: the network updates itself); "
                       "pass a torch optimizer")
    else:
        reasons.extend(_optimizer_reasons(opt))
    reasons.extend(lit.capture_blockers(trainer))
    if torch.is_anomaly_enabled():
        reasons.append("autograd anomaly detection is on (it reads every gradient)")
    reasons.extend(_module_reasons(lit.network, lit.loss_fn))
    reasons.extend(_hook_reasons(lit.network, lit.loss_fn))
    if trainer is not None:
        reasons.extend(_trainer_reasons(trainer))
    return SinkGraphPlan(not reasons, "; ".join(reasons))


def attached_trainer(module: Any) -> Any:
    """The Trainer ``module`` is attached to, or None (Lightning's ``trainer`` raises then)."""
    try:
        return module.trainer
    except (RuntimeError, AttributeError):
        return None
