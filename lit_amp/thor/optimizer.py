"""THOR, MindSpore's second-order optimizer, as a ``torch.optim.Optimizer`` (pure PyTorch).

``thor(net, learning_rate, damping, momentum, ...)`` (spec §4.1) returns a :class:`THOR`
optimizer over ``net``'s trainable parameters. Every ``frequency`` steps it runs one
**second-order step**: statistics hooks on the Linear / Conv1d / Conv2d / Embedding layers
record the Kronecker factors A and G of this batch, the factors are (optionally) averaged with
the previous ones, and their damped block-diagonal inverses are recomputed by Cholesky in fp32.
The ``frequency - 1`` **first-order steps** in between reuse the inverses with the hooks
removed, so they cost the preconditioning matmuls and nothing else. The optimizer counts its
own steps and installs / removes its hooks itself, so the alternation works in any loop: raw
PyTorch, :class:`~lit_amp.LitModel` (sink and non-sink mode), or a user's LightningModule.

One step, in MindSpore's order (``ThorGpu.construct``)::

    g  = grad / loss_scale
    g' = G⁻¹ · g · A⁻¹          Linear, Conv (g as (out, in·k)); Embedding: diag(A⁻¹) · g · G⁻¹
    g' = g / (g²/batch_size + √λ)   LayerNorm weight and bias (diagonal Fisher, every step)
    g' = g                      every other parameter (biases, BatchNorm, ...)
    g' += weight_decay · w      where decay_filter(param) is true
    g' = clip_by_norm(g', 1.0)  per tensor, if enable_clip_grad
    buf = momentum · buf + g';  w -= lr · buf     (Nesterov: w -= lr · (g' + momentum · buf))

with ``(A + √λ I)⁻¹`` and ``(G + √λ I)⁻¹`` (λ = damping at this step), inverted in
``split_dim``-sized diagonal blocks (the paper's "hardware-driven" split; 128 as on GPU).

Beyond MindSpore's release, from the THOR paper (both on by default: they won in
``bench/thor.py``; ``factor_decay=0.0, trace_thresholds=(0.0, 0.0)`` is the released
algorithm):

- ``factor_decay`` (default 0.5): a running average of the factors across refreshes,
  ``A ← β·A + (1-β)·A_batch`` (MindSpore uses the single refresh batch, β = 0, which
  diverged at larger learning rates or plateaued lower on MNIST-1D; β = 0.9 averaged too
  long and ended ~1.5 points lower on the MLP than β = 0.5 - tuning seeds 100-102, then
  ``bench/thor.py``).
- ``trace_thresholds=(ω1, ω2)`` (default the paper's THOR, (0.01, 0)): per factor,
  Δ = |tr(F+√λI) − tr(F_ref+√λI)| / tr(F_ref+√λI) against the factor last inverted; Δ > ω1
  re-inverts, ω2 ≤ Δ ≤ ω1 reuses the old inverse, Δ < ω2 stops refreshing that factor for
  good (its statistics are no longer collected). (0, 0) refreshes every time (MindSpore).

Under ``torch.distributed`` the new statistics are all-reduced (mean; one call per
``split_indices`` bucket) before they are used, so every rank holds identical factors,
inverses and trace decisions.

Example:
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    >>> opt = thor(net, learning_rate=0.05, damping=0.03, momentum=0.9, frequency=10)
    >>> for _ in range(3):
    ...     opt.zero_grad()
    ...     x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    ...     nn.functional.cross_entropy(net(x), y).backward()
    ...     opt.step()
    >>> opt.steps, opt.inversions
    (3, 4)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from lit_amp.thor.factors import LayerFactors, invert_factors, is_supported_layer

__all__ = ["THOR", "thor", "ParamInfo", "DEFAULT_FACTOR_DECAY", "DEFAULT_TRACE_THRESHOLDS"]

#: Default running-average coefficient of the factors (chosen by ``bench/thor.py``).
DEFAULT_FACTOR_DECAY = 0.5
#: Default (ω1, ω2) of the trace rule (chosen by ``bench/thor.py``).
DEFAULT_TRACE_THRESHOLDS = (0.01, 0.0)

_STATE_VERSION = 1
_LN = "layernorm"


@dataclass(frozen=True)
class ParamInfo:
    """What ``decay_filter`` receives: the parameter and its qualified name in ``net``.

    MindSpore passes a ``Parameter`` with a ``.name``; lit_amp passes this, so filters such as
    ``lambda x: "bias" not in x.name`` carry over (PyTorch names BatchNorm's gamma/beta
    ``weight``/``bias``).

    Example:
        >>> ParamInfo("fc.bias", torch.zeros(2)).name
        'fc.bias'
    """

    name: str
    param: Tensor

    @property
    def shape(self) -> torch.Size:
        return self.param.shape

    @property
    def ndim(self) -> int:
        return self.param.dim()


# ----------------------------------------------------------------------------- schedules
class _Schedule:
    """A float, a per-step sequence, or a callable of the step, read as ``at(step)``."""

    __slots__ = ("name", "const", "values", "fn")

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.const: float | None = None
        self.values: list[float] | None = None
        self.fn: Callable[[int], Any] | None = None
        if isinstance(value, bool):
            raise TypeError(_schedule_msg(name, value))
        if isinstance(value, (int, float)):
            self.const = float(value)
        elif isinstance(value, Tensor) or _is_ndarray(value):
            t = torch.as_tensor(value).detach()
            if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
                raise TypeError(_schedule_msg(name, value))
            if t.dim() == 0:
                self.const = float(t)
            elif t.dim() == 1 and t.numel() > 0:
                self.values = t.double().cpu().tolist()
            else:
                raise ValueError(
                    f"For 'thor', the argument '{name}' must be a float, a non-empty 1-D tensor of "
                    f"per-step values or a callable of the step, but got a tensor of shape "
                    f"{tuple(t.shape)}."
                )
        elif (
            isinstance(value, (list, tuple))
            and value
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        ):
            self.values = [float(v) for v in value]
        elif callable(value):
            self.fn = value
        else:
            raise TypeError(_schedule_msg(name, value))
        for v in [self.const] if self.const is not None else (self.values or []):
            if not math.isfinite(v) or v < 0:
                raise ValueError(
                    f"For 'thor', the argument '{name}' must hold finite values >= 0, but got {v}."
                )

    @property
    def first(self) -> float:
        """The value at step 0 for a float or a sequence (nan for a callable)."""
        if self.const is not None:
            return self.const
        if self.values is not None:
            return self.values[0]
        return float("nan")

    def at(self, step: int) -> float:
        if self.const is not None:
            return self.const
        if self.values is not None:
            if step >= len(self.values):
                raise ValueError(
                    f"For 'thor', the argument '{self.name}' holds {len(self.values)} per-step "
                    f"values but step {step} needs one: make the array cover every training "
                    f"step (steps per epoch x epochs), as MindSpore requires."
                )
            return self.values[step]
        assert self.fn is not None
        v = self.fn(step)
        return float(v.item() if isinstance(v, Tensor) else v)


def _is_ndarray(value: Any) -> bool:
    return type(value).__module__ == "numpy" and hasattr(value, "shape")


def _schedule_msg(name: str, value: Any) -> str:
    return (
        f"For 'thor', the argument '{name}' must be a float, a 1-D tensor (or array / list) of "
        f"per-step values, or a callable of the step, but got {type(value).__name__}: "
        f"{value!r}."
    )


# ----------------------------------------------------------------------------- checks
def _check_number(name: str, value: Any, *, minimum: float, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"For 'thor', the argument '{name}' must be a float, but got "
            f"{type(value).__name__}: {value!r}."
        )
    value = float(value)
    bad = value <= minimum if strict else value < minimum
    if bad or not math.isfinite(value):
        rel = ">" if strict else ">="
        raise ValueError(
            f"For 'thor', the argument '{name}' must be {rel} {minimum}, but got {value}."
        )
    return value


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(
            f"For 'thor', the argument '{name}' must be a bool, but got "
            f"{type(value).__name__}: {value!r}."
        )
    return value


def _check_int(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"For 'thor', the argument '{name}' must be an int, but got "
            f"{type(value).__name__}: {value!r}."
        )
    if value < minimum:
        raise ValueError(
            f"For 'thor', the argument '{name}' must be at least {minimum}, but got {value}."
        )
    return value


def _dist_world() -> int:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


# ----------------------------------------------------------------------------- optimizer
class THOR(Optimizer):
    """THOR: layer-wise K-FAC natural gradient with infrequent, block-diagonal inverses.

    Build it with :func:`thor` (MindSpore's signature and checks); the class also accepts
    ``frequency=1`` and lit_amp's keyword-only options.

    Args:
        net: the network; its trainable parameters are optimized and its supported layers
            (:data:`~lit_amp.thor.factors.SUPPORTED_LAYERS`) preconditioned.
        learning_rate: a float (then ``param_groups[0]["lr"]``, so torch LR schedulers work),
            a 1-D tensor / array / list with one value per step (MindSpore), or a callable
            ``step -> float``.
        damping: λ, in the same forms; √λ is added to each factor.
        momentum: momentum coefficient (>= 0).
        weight_decay: L2 coefficient added after preconditioning (>= 0).
        loss_scale: the optimizer divides gradients by it first (MindSpore's optimizer
            ``loss_scale``, paired with ``FixedLossScaleManager(S, drop_overflow_update=False)``).
        batch_size: the batch size used by the LayerNorm diagonal Fisher (``g²/batch_size``).
            Kronecker factors use the actual batch dimension of each step.
        use_nesterov: Nesterov momentum.
        decay_filter: ``ParamInfo -> bool``; weight decay applies where true (default: all).
        split_indices: layer indices that split the factor all-reduce into buckets (MindSpore's
            fusion split points); None: one bucket.
        enable_clip_grad: clip each preconditioned gradient to norm 1.0 (MindSpore's
            ``ClipByNorm(1.0)`` per tensor).
        frequency: steps per refresh: one second-order step, then ``frequency - 1``
            first-order steps (>= 1 here; :func:`thor` requires >= 2 as MindSpore).
        split_dim: block size of the block-diagonal inverses (128, MindSpore's GPU value); None
            inverts whole factors.
        factor_decay: running-average coefficient β of the factors across refreshes
            (default 0.5; 0 = MindSpore's single-batch factors).
        trace_thresholds: the paper's (ω1, ω2) (default (0.01, 0), the paper's THOR);
            (0, 0) re-inverts every factor at every refresh (MindSpore).
        grad_scale: the loss scale the backward passes run with, as a float or a callable
            returning it (G is divided by its square); None means ``loss_scale`` (MindSpore's
            pairing). :class:`~lit_amp.thor.ConvertModelUtils` wires it to the Model's loss
            scaler.
        skip_layers: qualified module names (or name prefixes) left unpreconditioned.

    Attributes:
        layers: the :class:`~lit_amp.thor.factors.LayerFactors` of the preconditioned layers.
        steps: optimizer steps taken.
        inversions: factor inversions computed so far (A and G count one each).
        refreshes: second-order steps taken.

    Raises:
        TypeError, ValueError: an argument has the wrong type or value (the message names it).

    Example:
        >>> net = nn.Linear(4, 2)
        >>> opt = THOR(net, 0.1, 0.01, 0.9, frequency=1, factor_decay=0.0)
        >>> opt.get_frequency(), len(opt.layers)
        (1, 1)
    """

    def __init__(
        self,
        net: nn.Module,
        learning_rate: float | Tensor | Sequence[float] | Callable[[int], float],
        damping: float | Tensor | Sequence[float] | Callable[[int], float],
        momentum: float,
        weight_decay: float = 0.0,
        loss_scale: float = 1.0,
        batch_size: int = 32,
        use_nesterov: bool = False,
        decay_filter: Callable[[ParamInfo], bool] | None = None,
        split_indices: Sequence[int] | None = None,
        enable_clip_grad: bool = False,
        frequency: int = 100,
        *,
        split_dim: int | None = 128,
        factor_decay: float = DEFAULT_FACTOR_DECAY,
        trace_thresholds: tuple[float, float] = DEFAULT_TRACE_THRESHOLDS,
        grad_scale: float | Callable[[], float] | None = None,
        skip_layers: Sequence[str] = (),
    ) -> None:
        if not isinstance(net, nn.Module):
            raise TypeError(
                f"For 'thor', the argument 'net' must be a torch.nn.Module, but got "
                f"{type(net).__name__}."
            )
        self._lr = _Schedule("learning_rate", learning_rate)
        self._damping = _Schedule("damping", damping)
        momentum = _check_number("momentum", momentum, minimum=0.0)
        weight_decay = _check_number("weight_decay", weight_decay, minimum=0.0)
        loss_scale = _check_number("loss_scale", loss_scale, minimum=0.0, strict=True)
        batch_size = _check_int("batch_size", batch_size, minimum=1)
        _check_bool("use_nesterov", use_nesterov)
        _check_bool("enable_clip_grad", enable_clip_grad)
        frequency = _check_int("frequency", frequency, minimum=1)
        if use_nesterov and momentum == 0:
            raise ValueError(
                "For 'thor', 'use_nesterov=True' needs 'momentum' > 0, but got momentum=0.0."
            )
        if decay_filter is not None and not callable(decay_filter):
            raise TypeError(
                f"For 'thor', the argument 'decay_filter' must be a callable ParamInfo -> bool "
                f"or None, but got {type(decay_filter).__name__}."
            )
        if split_dim is not None:
            split_dim = _check_int("split_dim", split_dim, minimum=1)
        factor_decay = _check_number("factor_decay", factor_decay, minimum=0.0)
        if factor_decay >= 1.0:
            raise ValueError(
                f"For 'thor', the argument 'factor_decay' must be in [0, 1), but got "
                f"{factor_decay}."
            )
        if (
            not isinstance(trace_thresholds, (tuple, list))
            or len(trace_thresholds) != 2
            or any(isinstance(w, bool) or not isinstance(w, (int, float)) for w in trace_thresholds)
        ):
            raise TypeError(
                "For 'thor', the argument 'trace_thresholds' must be a pair of floats "
                f"(omega1, omega2), but got {trace_thresholds!r}."
            )
        w1, w2 = float(trace_thresholds[0]), float(trace_thresholds[1])
        if not (0.0 <= w2 <= w1) or not math.isfinite(w1):
            raise ValueError(
                "For 'thor', the argument 'trace_thresholds' must satisfy 0 <= omega2 <= omega1, "
                f"but got {trace_thresholds!r}."
            )
        if grad_scale is not None and not callable(grad_scale):
            _check_number("grad_scale", grad_scale, minimum=0.0, strict=True)
        if isinstance(skip_layers, str) or not all(isinstance(s, str) for s in skip_layers):
            raise TypeError(
                "For 'thor', the argument 'skip_layers' must be a sequence of module names, but "
                f"got {skip_layers!r}."
            )

        names = {id(p): n for n, p in net.named_parameters()}
        params = [p for p in net.parameters() if p.requires_grad]
        if not params:
            raise ValueError("For 'thor', the argument 'net' has no trainable parameters.")
        defaults = {
            "lr": self._lr.first,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "nesterov": use_nesterov,
            "loss_scale": loss_scale,
        }
        if math.isnan(defaults["lr"]):
            defaults["lr"] = 0.0
        super().__init__(params, defaults)
        if self._lr.const is not None:
            self._lr_sched: _Schedule | None = None  # group["lr"] rules (torch schedulers)
        else:
            self._lr_sched = self._lr
        self.loss_scale = loss_scale
        self.batch_size = batch_size
        self.frequency = frequency
        self.enable_clip_grad = enable_clip_grad
        self.split_dim = split_dim
        self.factor_decay = factor_decay
        self.trace_thresholds = (w1, w2)
        self.grad_scale = grad_scale

        # preconditioned layers and per-parameter handlers
        self.layers: list[LayerFactors] = []
        self._handler: dict[Tensor, Any] = {}
        seen: set[int] = set()
        for name, module in net.named_modules():
            if any(name == s or name.startswith(s + ".") for s in skip_layers):
                continue
            if is_supported_layer(module):
                w = module.weight
                if id(w) in seen:
                    continue  # a tied weight is preconditioned by its first layer
                seen.add(id(w))
                lf = LayerFactors(module, name, len(self.layers))
                self.layers.append(lf)
                self._handler[w] = lf
            elif isinstance(module, nn.LayerNorm):
                for p in module.parameters(recurse=False):
                    if p.requires_grad and id(p) not in seen:
                        seen.add(id(p))
                        self._handler[p] = _LN
        for module in net.modules():
            if isinstance(module, nn.Embedding) and module.sparse and module.weight.requires_grad:
                raise ValueError(
                    "For 'thor', sparse gradients are not supported: an nn.Embedding with "
                    "sparse=True was found; use sparse=False."
                )
        self.split_indices = self._check_split_indices(split_indices)
        flt = decay_filter
        self._decay: dict[Tensor, bool] = {
            p: bool(flt(ParamInfo(names.get(id(p), ""), p))) if flt is not None else True
            for p in params
        }
        self.steps = 0
        self.refreshes = 0
        self.inversions = 0
        self.inversion_flops = 0.0
        self._stats_active = False
        self._sync_hooks(force=True)

    # ------------------------------------------------------------------ config
    def _check_split_indices(self, split_indices: Any) -> list[int]:
        n = len(self.layers)
        if split_indices is None:
            return [max(n - 1, 0)]
        if not isinstance(split_indices, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in split_indices
        ):
            raise TypeError(
                "For 'thor', the argument 'split_indices' must be a list of ints or None, but "
                f"got {split_indices!r}."
            )
        idx = list(split_indices)
        if idx and (idx != sorted(set(idx)) or idx[0] < 0):
            raise ValueError(
                "For 'thor', the argument 'split_indices' must be increasing, non-negative layer "
                f"indices, but got {idx!r}."
            )
        return idx

    def get_frequency(self) -> int:
        """The refresh interval (MindSpore's ``get_frequency``)."""
        return self.frequency

    @property
    def is_second_order_step(self) -> bool:
        """Whether the next step refreshes the factors (its statistics hooks are installed)."""
        return self._stats_active

    def current_lr(self) -> float:
        """The learning rate the next step uses."""
        if self._lr_sched is not None:
            return self._lr_sched.at(self.steps)
        return float(self.param_groups[0]["lr"])

    def current_damping(self) -> float:
        """The damping λ the next step uses."""
        return self._damping.at(self.steps)

    def _grad_scale_value(self) -> float:
        gs = self.grad_scale
        if gs is None:
            return float(self.param_groups[0].get("loss_scale", self.loss_scale))
        v = gs() if callable(gs) else gs
        return float(v.item() if isinstance(v, Tensor) else v)

    # ------------------------------------------------------------------ hooks
    def _sync_hooks(self, force: bool = False) -> None:
        want = self.steps % self.frequency == 0
        if not force and want == self._stats_active:
            return
        active = False
        for lf in self.layers:
            if want and not all(lf.frozen):
                lf.install()
                active = True
            else:
                lf.remove()
        self._stats_active = active

    def remove_hooks(self) -> None:
        """Remove every statistics hook (the optimizer then keeps its current inverses)."""
        for lf in self.layers:
            lf.remove()
        self._stats_active = False

    # ------------------------------------------------------------------ refresh
    def _refresh(self, damping: float) -> None:
        """Second-order step: consume statistics, average, trace rule, invert."""
        sq = math.sqrt(damping)
        scale = self._grad_scale_value()
        active = [lf for lf in self.layers if lf.installed]
        pend: list[list[Tensor | None]] = [list(lf.take_pending(scale)) for lf in active]
        if _dist_world() > 1:
            pend = self._allreduce(active, pend)
        flat = [t for pair in pend for t in pair if t is not None]
        if flat:
            ok = torch.stack([torch.isfinite(t).all() for t in flat]).tolist()
            it = iter(ok)
            for pair in pend:
                for f in (0, 1):
                    if pair[f] is not None and not next(it):
                        pair[f] = None  # an overflowing batch: keep the old factor
        beta = self.factor_decay
        for lf, (a, g) in zip(active, pend):
            if a is not None:
                lf.A = a if lf.A is None or beta == 0 else lf.A.mul(beta).add_(a, alpha=1 - beta)
            if g is not None:
                lf.G = g if lf.G is None or beta == 0 else lf.G.mul(beta).add_(g, alpha=1 - beta)
        # trace rule (one host sync for every candidate factor)
        cands: list[tuple[LayerFactors, int]] = []
        traces: list[Tensor] = []
        for lf in active:
            for f, mat in ((0, lf.A), (1, lf.G)):
                if mat is None or lf.frozen[f]:
                    continue
                dim = lf.a_dim if f == 0 else lf.g_dim
                tr = mat.sum() if mat.dim() == 1 else mat.diagonal().sum()
                cands.append((lf, f))
                traces.append(tr + sq * dim)
        if not cands:
            return
        tr_vals = torch.stack(traces).tolist()
        w1, w2 = self.trace_thresholds
        todo: list[tuple[LayerFactors, int, float]] = []
        for (lf, f), tr in zip(cands, tr_vals):
            inv = lf.A_inv if f == 0 else lf.G_inv
            ref = lf.trace_ref[f]
            if inv is None or ref is None or ref <= 0:
                todo.append((lf, f, tr))
                continue
            delta = abs(tr - ref) / ref
            if delta > w1:
                todo.append((lf, f, tr))
            elif delta < w2:
                lf.frozen[f] = True
                if all(lf.frozen):
                    lf.remove()
        self.refreshes += 1
        if not todo:
            return
        mats, where = [], []
        for lf, f, tr in todo:
            lf.trace_ref[f] = tr
            if lf.kind == "embedding" and f == 0:
                assert lf.A is not None
                lf.A_inv = 1.0 / (lf.A + sq)
                continue
            mats.append(lf.A if f == 0 else lf.G)
            where.append((lf, f))
        invs = invert_factors(mats, sq, self.split_dim)  # type: ignore[arg-type]
        for (lf, f), inv in zip(where, invs):
            if f == 0:
                lf.A_inv = inv
            else:
                lf.G_inv = inv
        self.inversions += len(todo)
        for lf, f, _ in todo:
            d = lf.a_dim if f == 0 else lf.g_dim
            if lf.kind == "embedding" and f == 0:
                self.inversion_flops += d
                continue
            b = d if self.split_dim is None else min(d, self.split_dim)
            self.inversion_flops += math.ceil(d / b) * b**3  # Cholesky + inverse ~ b³ a block

    def _allreduce(
        self, active: list[LayerFactors], pend: list[list[Tensor | None]]
    ) -> list[list[Tensor | None]]:
        """Mean of each new factor over the ranks that have one (identical on every rank)."""
        dist = torch.distributed
        buckets: list[list[int]] = [[]]
        bounds = list(self.split_indices)
        for i, lf in enumerate(active):
            buckets[-1].append(i)
            if bounds and lf.index >= bounds[0]:
                while bounds and lf.index >= bounds[0]:
                    bounds.pop(0)
                buckets.append([])
        out = [list(p) for p in pend]
        for bucket in buckets:
            slots: list[tuple[int, int, torch.Size]] = []
            parts: list[Tensor] = []
            for i in bucket:
                lf = active[i]
                for f in (0, 1):
                    if lf.frozen[f]:
                        continue
                    t = pend[i][f]
                    ref = lf.A if f == 0 else lf.G
                    if t is None and ref is None:
                        dim = lf.a_dim if f == 0 else lf.g_dim
                        shape = (
                            torch.Size([dim])
                            if (lf.kind == "embedding" and f == 0)
                            else (torch.Size([dim, dim]))
                        )
                    else:
                        shape = (t if t is not None else ref).shape  # type: ignore[union-attr]
                    dev = lf.weight.device
                    data = (
                        t.reshape(-1).float()
                        if t is not None
                        else torch.zeros(shape.numel(), device=dev)
                    )
                    parts.append(data)
                    slots.append((i, f, shape))
            if not slots:
                continue
            dev = parts[0].device
            flags = torch.tensor(
                [0.0 if pend[i][f] is None else 1.0 for i, f, _ in slots], device=dev
            )
            buf = torch.cat([*(p.to(dev) for p in parts), flags])
            dist.all_reduce(buf)
            counts = buf[-len(slots) :].tolist()
            offset = 0
            for (i, f, shape), c in zip(slots, counts):
                n = shape.numel()
                chunk = buf[offset : offset + n]
                offset += n
                out[i][f] = None if c == 0 else (chunk / c).view(shape).to(active[i].weight.device)
        return out

    # ------------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """One THOR step (second-order every ``frequency`` steps, first-order otherwise).

        Args:
            closure: optional callable that re-evaluates the model and returns the loss.

        Returns:
            The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        k = self.steps
        sqrt_damp: float | None = None
        if self._stats_active:
            damping = self._damping.at(k)
            sqrt_damp = math.sqrt(damping)
            self._refresh(damping)
        lr_k = self._lr_sched.at(k) if self._lr_sched is not None else None
        handler = self._handler
        for group in self.param_groups:
            params: list[Tensor] = []
            raw: list[Tensor] = []
            for p in group["params"]:
                if p.grad is not None:
                    if p.grad.is_sparse:
                        raise RuntimeError(
                            "THOR does not support sparse gradients; use dense layers."
                        )
                    params.append(p)
                    raw.append(p.grad)
            if lr_k is not None:
                group["lr"] = lr_k
            if not params:
                continue
            ls = group.get("loss_scale", 1.0)
            grads = list(torch._foreach_mul(raw, 1.0 / ls)) if ls != 1.0 else list(raw)
            for i, p in enumerate(params):
                h = handler.get(p)
                if h is None:
                    continue
                if h is _LN:
                    if sqrt_damp is None:
                        sqrt_damp = math.sqrt(self._damping.at(k))
                    g = grads[i]
                    grads[i] = g / (g * g / self.batch_size + sqrt_damp)
                elif h.ready:
                    grads[i] = h.precondition(grads[i])
            wd = group["weight_decay"]
            if wd:
                idx = [i for i, p in enumerate(params) if self._decay.get(p, True)]
                if idx:
                    dec = torch._foreach_add(
                        [grads[i] for i in idx], [params[i] for i in idx], alpha=wd
                    )
                    for i, d in zip(idx, dec):
                        grads[i] = d
            if self.enable_clip_grad:
                norms = torch._foreach_norm(grads)
                grads = [
                    g * (1.0 / torch.clamp_min(n, 1.0)).to(g.dtype) for g, n in zip(grads, norms)
                ]
            lr = group["lr"]
            m = group["momentum"]
            if m != 0:
                bufs = []
                for p in params:
                    st = self.state[p]
                    buf = st.get("momentum_buffer")
                    if buf is None:
                        buf = st["momentum_buffer"] = torch.zeros_like(
                            p, memory_format=torch.preserve_format
                        )
                    bufs.append(buf)
                torch._foreach_mul_(bufs, m)
                torch._foreach_add_(bufs, grads)
                upd = torch._foreach_add(grads, bufs, alpha=m) if group["nesterov"] else bufs
            else:
                upd = grads
            torch._foreach_add_(params, upd, alpha=-lr)
        self.steps = k + 1
        self._sync_hooks()
        return loss

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The torch optimizer state plus THOR's: step counter, factors, inverses, traces."""
        sd = super().state_dict()
        sd["thor"] = {
            "version": _STATE_VERSION,
            "steps": self.steps,
            "refreshes": self.refreshes,
            "inversions": self.inversions,
            "inversion_flops": self.inversion_flops,
            "layers": [lf.state_dict() for lf in self.layers],
        }
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a plain torch optimizer state restores momentum only).

        Raises:
            ValueError: the saved THOR state has a different number of layers.
        """
        state_dict = dict(state_dict)
        thor_state = state_dict.pop("thor", None)
        if thor_state is not None and len(thor_state["layers"]) != len(self.layers):
            raise ValueError(
                f"THOR.load_state_dict: the checkpoint holds {len(thor_state['layers'])} "
                f"preconditioned layers but this optimizer has {len(self.layers)}; was it built "
                "on the same network?"
            )
        super().load_state_dict(state_dict)
        if thor_state is None:
            return
        layers = thor_state["layers"]
        for lf, st in zip(self.layers, layers):
            lf.load_state_dict(st)
        self.steps = int(thor_state["steps"])
        self.refreshes = int(thor_state.get("refreshes", 0))
        self.inversions = int(thor_state.get("inversions", 0))
        self.inversion_flops = float(thor_state.get("inversion_flops", 0.0))
        self._sync_hooks(force=True)

    def __repr__(self) -> str:
        return (
            f"THOR(layers={len(self.layers)}, frequency={self.frequency}, "
            f"split_dim={self.split_dim}, factor_decay={self.factor_decay}, "
            f"trace_thresholds={self.trace_thresholds}, steps={self.steps})"
        )


def thor(
    net: nn.Module,
    learning_rate: float | Tensor | Sequence[float] | Callable[[int], float],
    damping: float | Tensor | Sequence[float] | Callable[[int], float],
    momentum: float,
    weight_decay: float = 0.0,
    loss_scale: float = 1.0,
    batch_size: int = 32,
    use_nesterov: bool = False,
    decay_filter: Callable[[ParamInfo], bool] | None = None,
    split_indices: Sequence[int] | None = None,
    enable_clip_grad: bool = False,
    frequency: int = 100,
    **kwargs: Any,
) -> THOR:
    """MindSpore's ``nn.thor``: the THOR second-order optimizer over ``net``'s parameters.

    Unlike MindSpore, ``net`` is not converted (hooks record the statistics) and
    ``learning_rate`` may also be a float or a callable. ``kwargs`` are :class:`THOR`'s
    keyword-only options (``split_dim``, ``factor_decay``, ``trace_thresholds``,
    ``grad_scale``, ``skip_layers``).

    Args:
        net: the network to train.
        learning_rate: float, per-step 1-D tensor (MindSpore) or callable of the step.
        damping: float, per-step 1-D tensor or callable of the step.
        momentum: float >= 0.
        weight_decay: float >= 0.
        loss_scale: float > 0; gradients are divided by it first.
        batch_size: int >= 1 (LayerNorm's diagonal Fisher).
        use_nesterov: bool.
        decay_filter: ``ParamInfo -> bool`` or None (all parameters decay).
        split_indices: all-reduce bucket split points over layer indices, or None.
        enable_clip_grad: bool.
        frequency: int >= 2: one second-order step every ``frequency`` steps.

    Returns:
        A :class:`THOR` optimizer.

    Raises:
        TypeError: an argument has the wrong type (``learning_rate`` not a float, tensor or
            callable; ``momentum`` not a float; ``frequency`` not an int; ...).
        ValueError: ``momentum`` or ``weight_decay`` < 0, ``loss_scale`` <= 0, ``frequency``
            < 2, a per-step array that is empty or not 1-D.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> temp = torch.tensor([4e-4, 1e-4, 1e-5, 1e-5])
        >>> opt = thor(net, learning_rate=temp, damping=temp, momentum=0.9, loss_scale=128,
        ...            frequency=4)
        >>> opt.get_frequency(), len(opt.layers)
        (4, 2)
    """
    if isinstance(frequency, bool) or not isinstance(frequency, int):
        raise TypeError(
            f"For 'thor', the argument 'frequency' must be an int, but got "
            f"{type(frequency).__name__}: {frequency!r}."
        )
    if frequency < 2:
        raise ValueError(
            f"For 'thor', the argument 'frequency' must be at least 2, but got {frequency}."
        )
    return THOR(
        net,
        learning_rate,
        damping,
        momentum,
        weight_decay,
        loss_scale,
        batch_size,
        use_nesterov,
        decay_filter,
        split_indices,
        enable_clip_grad,
        frequency,
        **kwargs,
    )
