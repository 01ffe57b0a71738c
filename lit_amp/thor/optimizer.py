"""THOR, MindSpore's second-order optimizer, as a ``torch.optim.Optimizer`` (pure PyTorch).

``thor(net, learning_rate, damping, momentum, ...)`` (docs/semantics.md §4.1-4.2) gives a
:class:`THOR` optimizer over ``net``'s trainable parameters. Every ``frequency`` steps one
second-order step records the Kronecker factors of the Linear / Conv / Embedding layers and
re-inverts them; the steps between reuse the inverses with the statistics hooks removed. The
optimizer counts its own steps and installs its hooks itself, so the alternation works in any
loop: raw PyTorch, :class:`~lit_amp.LitModel` (sink mode too) or a user's LightningModule.

This module holds the step, the hook timing and the checkpoint state; argument checks and
schedules are in ``_arguments``, the refresh in ``_second_order``, the momentum update in
``_sgd``, per-layer factors in :mod:`~lit_amp.thor.factors`. The paper's options that MindSpore
lacks are in docs/differences.md, "THOR".

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

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim import optimizer as _torch_optimizer

from lit_amp._validation import check_bool, check_int, check_positive_int, check_type
from lit_amp.thor._arguments import (
    OWNER,
    Schedule,
    check_callable,
    check_factor_decay,
    check_grad_scale,
    check_group_defaults,
    check_no_sparse_embedding,
    check_skip_layers,
    check_split_dim,
    check_split_indices,
    check_trace_thresholds,
    placed_start,
    schedule_state,
)
from lit_amp.thor._second_order import LAYERNORM, plan_layers, refresh
from lit_amp.thor._sgd import decayed_positions, momentum_buffers, update_
from lit_amp.thor.factors import LayerFactors

__all__ = [
    "THOR",
    "thor",
    "ParamInfo",
    "DEFAULT_FACTOR_DECAY",
    "DEFAULT_TRACE_THRESHOLDS",
    "RECOMMENDED_RECIPE",
]

#: Default running-average coefficient of the factors (chosen by ``bench/thor.py``).
DEFAULT_FACTOR_DECAY = 0.5
#: Default (ω1, ω2) of the trace rule (chosen by ``bench/thor.py``).
DEFAULT_TRACE_THRESHOLDS = (0.01, 0.0)

#: The recommended recipe (docs/benchmarks.md, THOR section): refresh every 10 steps,
#: trace rule (0.1, 0), K-FAC's π-split damping and biases in A. Use it with a *constant*
#: damping (a float, or ``get_thor_damping(..., decay_rate=1.0, ...)``). Measured against ASDL's
#: K-FAC there (fewer epochs on the CNN; on the MLP as many or more, depending on the lr/damping
#: picked). The defaults stay MindSpore's rules (``pi_damping=False``, ``bias_in_a=False``) so
#: that ``thor(...)`` matches MindSpore's THOR.
#: Example: ``thor(net, lr, 0.03, 0.9, weight_decay=0.02, **RECOMMENDED_RECIPE)``.
RECOMMENDED_RECIPE: dict[str, Any] = {
    "frequency": 10,
    "trace_thresholds": (0.1, 0.0),
    "pi_damping": True,
    "bias_in_a": True,
}

_STATE_VERSION = 1


def _observed(opt: Optimizer) -> bool:
    """Whether anything watches optimizer steps: a running profiler or a step hook."""
    return bool(
        torch._C._autograd._profiler_enabled()
        or opt._optimizer_step_pre_hooks
        or opt._optimizer_step_post_hooks
        or _torch_optimizer._global_optimizer_pre_hooks
        or _torch_optimizer._global_optimizer_post_hooks
    )


def _light_step(func: Callable[..., Any]) -> Callable[..., Any]:
    """torch's ``Optimizer.profile_hook_step`` wrapper (profiler label, step pre/post hooks),
    skipped while nothing observes the step: its ``record_function`` alone costs a noticeable
    part of a small first-order step (docs/benchmarks.md, THOR section)."""
    hooked = Optimizer.profile_hook_step(func)

    @functools.wraps(func)
    def step(self: Optimizer, *args: Any, **kwargs: Any) -> Any:
        if _observed(self):
            return hooked(self, *args, **kwargs)
        return func(self, *args, **kwargs)

    step.hooked = True  # torch must not wrap it again
    return step


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


class THOR(Optimizer):
    """THOR: layer-wise K-FAC natural gradient with infrequent, block-diagonal inverses.

    :func:`thor` (MindSpore's name) takes the same arguments and requires ``frequency >= 2``
    as MindSpore does; the class also accepts ``frequency=1``.

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
            pairing). :class:`~lit_amp.thor.convert.ConvertModelUtils` wires it to the Model's loss
            scaler.
        skip_layers: qualified module names (or name prefixes) left unpreconditioned.
        pi_damping: K-FAC's π-split damping (Martens & Grosse 2015 §6.3, ASDL): √λ·π on A,
            √λ/π on G, π = √((tr A/d_A)/(tr G/d_G)) per layer; False: √λ on both (MindSpore).
        bias_in_a: precondition each layer's bias with its weight (a ones column in A, as K-FAC
            does); False: biases take plain momentum SGD (MindSpore).

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
        pi_damping: bool = False,
        bias_in_a: bool = False,
    ) -> None:
        check_type(OWNER, "net", net, nn.Module, "a torch.nn.Module")
        self._lr = Schedule("learning_rate", learning_rate)
        self._damping = Schedule("damping", damping)
        defaults = check_group_defaults(
            self._lr.first, momentum, weight_decay, loss_scale, use_nesterov
        )
        self.batch_size: int = check_positive_int(OWNER, "batch_size", batch_size)
        self.enable_clip_grad: bool = check_bool(OWNER, "enable_clip_grad", enable_clip_grad)
        self.frequency: int = check_positive_int(OWNER, "frequency", frequency)
        check_callable("decay_filter", decay_filter, "a callable ParamInfo -> bool")
        self.split_dim: int | None = check_split_dim(split_dim)
        self.factor_decay: float = check_factor_decay(factor_decay)
        self.trace_thresholds: tuple[float, float] = check_trace_thresholds(trace_thresholds)
        self.pi_damping: bool = check_bool(OWNER, "pi_damping", pi_damping)
        check_bool(OWNER, "bias_in_a", bias_in_a)
        self.grad_scale = check_grad_scale(grad_scale)
        skip_layers = check_skip_layers(skip_layers)

        params = [p for p in net.parameters() if p.requires_grad]
        if not params:
            raise ValueError(f"For '{OWNER}', the argument 'net' has no trainable parameters.")
        super().__init__(params, defaults)
        # a constant rate lives in group["lr"] only (so torch LR schedulers rule it)
        self._lr_sched: Schedule | None = None if self._lr.const is not None else self._lr
        self.loss_scale: float = defaults["loss_scale"]
        self.layers: list[LayerFactors]
        self.layers, self._handler = plan_layers(net, skip_layers, bias_in_a)
        check_no_sparse_embedding(net)
        self.split_indices = check_split_indices(split_indices, len(self.layers))
        names = {id(p): n for n, p in net.named_parameters()}
        self._decay: dict[Tensor, bool] = {
            p: bool(decay_filter(ParamInfo(names.get(id(p), ""), p)))
            if decay_filter is not None
            else True
            for p in params
        }
        self.steps = 0
        self.refreshes = 0
        self.inversions = 0
        self.inversion_flops = 0.0
        self._stats_active = False
        self._plans: dict[tuple[int, ...], tuple[list[tuple[LayerFactors, int, int]], list[int]]]
        self._plans = {}
        self._decay_idx: dict[tuple[int, ...], list[int]] = {}
        # per parameter list: one flat tensor whose views are the momentum buffers
        self._flat_bufs: dict[tuple[int, ...], tuple[Tensor, list[Tensor]]] = {}
        self._sync_hooks(force=True)

    # ------------------------------------------------------------------ config
    def get_frequency(self) -> int:
        """The refresh interval (MindSpore's ``get_frequency``)."""
        return self.frequency

    @property
    def is_second_order_step(self) -> bool:
        """Whether the next step refreshes the factors (its statistics hooks are installed)."""
        return self._stats_active

    #: the step at which index 0 of the per-step ``learning_rate`` / ``damping`` array sits: 0,
    #: or the cut point of an array cut at the resume step (:meth:`load_state_dict`)
    _lr_start = 0
    _damping_start = 0

    def _lr_at(self, step: int) -> float:
        assert self._lr_sched is not None
        return self._lr_sched.at(step - self._lr_start)

    def _damping_at(self, step: int) -> float:
        return self._damping.at(step - self._damping_start)

    def current_lr(self) -> float:
        """The learning rate the next step uses."""
        if self._lr_sched is not None:
            return self._lr_at(self.steps)
        return float(self.param_groups[0]["lr"])

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

    # ------------------------------------------------------------------ step
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients (torch's ``zero_grad``; without its profiler label while no
        profiler runs).

        Args:
            set_to_none: set the gradients to None rather than zero (torch's default).
        """
        if not set_to_none or torch._C._autograd._profiler_enabled():
            super().zero_grad(set_to_none)
            return
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    @_light_step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One THOR step (second-order every ``frequency`` steps, first-order otherwise).

        Args:
            closure: optional callable that re-evaluates the model and returns the loss.

        Returns:
            The closure's loss, or None.

        Raises:
            RuntimeError: a parameter has a sparse gradient.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        k = self.steps
        if self._stats_active:
            self._refresh(self._damping_at(k))
        lr_k = self._lr_at(k) if self._lr_sched is not None else None
        for group in self.param_groups:
            if lr_k is not None:
                group["lr"] = lr_k
            params, grads = self._unscaled_grads(group)
            if params:
                grads = self._precondition(params, grads, k)
                self._update(group, params, grads)
        self.steps = k + 1
        self._sync_hooks()
        return loss

    def _refresh(self, damping: float) -> None:
        """Second-order step: consume statistics, average, trace rule, invert."""
        refreshed, inversions, flops = refresh(
            self.layers,
            damping,
            self._grad_scale_value(),
            factor_decay=self.factor_decay,
            trace_thresholds=self.trace_thresholds,
            split_dim=self.split_dim,
            split_indices=self.split_indices,
            pi_damping=self.pi_damping,
        )
        self.refreshes += int(refreshed)
        self.inversions += inversions
        self.inversion_flops += flops

    def _unscaled_grads(self, group: dict[str, Any]) -> tuple[list[Tensor], list[Tensor]]:
        """The group's parameters that have a gradient, and ``grad / loss_scale``."""
        params: list[Tensor] = []
        raw: list[Tensor] = []
        for p in group["params"]:
            if p.grad is not None:
                if p.grad.is_sparse:
                    raise RuntimeError("THOR does not support sparse gradients; use dense layers.")
                params.append(p)
                raw.append(p.grad)
        ls = group.get("loss_scale", 1.0)
        if params and ls != 1.0:
            return params, list(torch._foreach_mul(raw, 1.0 / ls))
        return params, list(raw)

    def _precondition(self, params: list[Tensor], grads: list[Tensor], k: int) -> list[Tensor]:
        """Kronecker factors for supported layers, LayerNorm's diagonal Fisher; others as is."""
        layers, norms = self._plan(params)
        for lf, i, j in layers:
            if not lf.ready:
                continue
            if lf.bias is None:
                grads[i] = lf.precondition(grads[i])
            else:  # the bias rides in A's ones column (zero when it has no gradient)
                grads[i], b = lf.precondition_with_bias(grads[i], grads[j] if j >= 0 else None)
                if j >= 0:
                    grads[j] = b
        if norms:
            sqrt_damp = math.sqrt(self._damping_at(k))
            for i in norms:
                g = grads[i]
                grads[i] = g / (g * g / self.batch_size + sqrt_damp)
        return grads

    def _plan(self, params: list[Tensor]) -> tuple[list[tuple[LayerFactors, int, int]], list[int]]:
        """Per parameter list (cached while it stays the same): ``(layer, weight position,
        bias position or -1)`` of the preconditioned layers and the LayerNorm positions."""
        key = tuple(map(id, params))
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        pos = {id(p): i for i, p in enumerate(params)}
        layers: list[tuple[LayerFactors, int, int]] = []
        norms: list[int] = []
        for i, p in enumerate(params):
            h = self._handler.get(p)
            if h is LAYERNORM:
                norms.append(i)
            elif isinstance(h, LayerFactors):
                j = pos.get(id(h.bias), -1) if h.bias is not None else -1
                layers.append((h, i, j))
        if len(self._plans) > 8:
            self._plans.clear()
        self._plans[key] = (layers, norms)
        return layers, norms

    def _update(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor]) -> None:
        update_(
            group, params, grads,
            decayed=lambda: decayed_positions(params, self._decay, self._decay_idx),
            buffers=lambda: momentum_buffers(self.state, params, self._flat_bufs),
            clip=self.enable_clip_grad,
        )

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
            # the per-step arrays (MindSpore's checkpoint holds its ``learning_rate`` too)
            "schedules": {
                "learning_rate": schedule_state(self._lr, self._lr_start),
                "damping": schedule_state(self._damping, self._damping_start),
            },
        }
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a plain torch optimizer state restores momentum only).

        The step counter is restored (MindSpore's ``global_step``), and a per-step
        ``learning_rate`` / ``damping`` array is placed so that each step takes the rate of the
        run that wrote the state:

        - the array the state was saved with: the counter indexes it (step ``s`` takes
          ``array[s]``, MindSpore's ``learning_rate[global_step]``);
        - that run's array cut at another step ``k`` (the model zoo's ``get_thor_lr(k, ...)``
          returns the values from step ``k`` on; ``k <=`` the counter), or the whole array
          where the state was saved with a cut one (``k = 0``): step ``s`` takes
          ``array[s - k]``, the uninterrupted run's rate (MindSpore refuses the load: the
          ``learning_rate`` shapes differ);
        - any other array: the counter indexes it, and a UserWarning says so.

        Raises:
            ValueError: the saved THOR state has a different number of layers; an array cut
                after the step the state was saved at.
        """
        state_dict = dict(state_dict)
        thor_state = state_dict.pop("thor", None)
        if thor_state is not None and len(thor_state["layers"]) != len(self.layers):
            raise ValueError(
                f"THOR.load_state_dict: the checkpoint holds {len(thor_state['layers'])} "
                f"preconditioned layers but this optimizer has {len(self.layers)}; was it built "
                "on the same network?"
            )
        starts = (0, 0)
        if thor_state is not None:  # checked before anything is loaded
            saved = thor_state.get("schedules") or {}
            at = int(thor_state["steps"])
            starts = (placed_start(self._lr, saved.get("learning_rate"), at),
                      placed_start(self._damping, saved.get("damping"), at))
        super().load_state_dict(state_dict)
        if thor_state is None:
            return
        layers = thor_state["layers"]
        for lf, st in zip(self.layers, layers):
            lf.load_state_dict(st)
        self._lr_start, self._damping_start = starts
        self.steps = int(thor_state["steps"])
        self.refreshes = int(thor_state.get("refreshes", 0))
        self.inversions = int(thor_state.get("inversions", 0))
        self.inversion_flops = float(thor_state.get("inversion_flops", 0.0))
        self._sync_hooks(force=True)

    def __getstate__(self) -> dict[str, Any]:
        """All attributes (torch pickles only defaults, state, param_groups); the layers carry
        their modules, so pickle ``(net, opt)`` together to keep them linked."""
        state = dict(self.__dict__)
        state["_plans"], state["_decay_idx"] = {}, {}  # keyed by ids, which do not survive
        state["_flat_bufs"] = {}
        return state

    def __repr__(self) -> str:
        return (
            f"THOR(layers={len(self.layers)}, frequency={self.frequency}, "
            f"split_dim={self.split_dim}, factor_decay={self.factor_decay}, "
            f"trace_thresholds={self.trace_thresholds}, steps={self.steps})"
        )


def thor(net: nn.Module, *args: Any, **kwargs: Any) -> THOR:
    """MindSpore's ``nn.thor``: the THOR second-order optimizer over ``net``'s parameters.

    Takes :class:`THOR`'s arguments (see its Args; ``inspect.signature(thor)`` shows them) and
    adds MindSpore's one stricter rule: ``frequency`` >= 2. Unlike MindSpore, ``net`` is not
    converted (hooks record the statistics) and ``learning_rate`` may also be a float or a
    callable.

    Args:
        net: the network to train.
        *args: :class:`THOR`'s positional arguments after ``net``.
        **kwargs: :class:`THOR`'s keyword arguments.

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
    try:
        bound = _SIGNATURE.bind(net, *args, **kwargs)
    except TypeError as err:  # a missing / unexpected argument, named as Python names it
        raise TypeError(f"thor() {err}") from None
    bound.apply_defaults()
    check_int(OWNER, "frequency", bound.arguments["frequency"], minimum=2)
    return THOR(net, *args, **kwargs)


_SIGNATURE = inspect.signature(THOR)
# one signature: ``thor`` shows THOR's parameters to ``help()`` and to the CLI, which reads the
# first parameter's name (``net``) to pass the network rather than its parameters
thor.__signature__ = _SIGNATURE.replace(return_annotation=THOR)
