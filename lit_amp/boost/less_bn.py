"""LessBN: fewer BatchNorm layers, a normalized classifier head, gradient centralization.

MindSpore's ``LessBN`` (docs/semantics.md §3.3, MS ``boost/less_batch_normalization.py``, graph pass
``frontend/optimizer/irpass/less_batch_normalization.cc``) has three parts; lit_amp does each
eagerly, on the module tree:

1. **BatchNorm reduction** (:func:`remove_residual_bn`). MindSpore's graph pass matches a
   residual ``Add`` whose main branch is ``BN <- Conv <- ReLU <- BN <- Conv <- ReLU ...`` back
   to the block input and deletes every BatchNorm of that branch **except the last one** (the
   one feeding the ``Add``); the shortcut branch (identity, or ``Conv -> BN`` downsample) and
   every BatchNorm outside residual blocks (the stem) are kept. Its patterns only match
   3-conv bottleneck blocks (bn1 and bn2 go, bn3 stays); lit_amp applies the same rule to any
   residual branch with at least two convolutions, so a 2-conv basic block loses ``bn1`` and
   keeps ``bn2``. Removed layers become ``nn.Identity`` (their parameters leave the network and
   the optimizer; the preceding conv keeps ``bias=False``, as in MindSpore). Blocks are found
   by ``torch.fx`` tracing; a network that cannot be traced keeps its BatchNorms (warning).
2. **Normalized head** (``fn_flag``, :func:`replace_head_with_fn`): the network's last
   ``nn.Linear`` becomes :class:`CommonHeadLastFN`, ``y = m * normalize(x) @ normalize(W)^T``
   with a learnable scalar ``m`` (init 1) and no bias; ``W`` is the same Parameter object.
   MindSpore replaces the last Dense *of every cell that owns Dense children*, which would also
   turn the inner layers of SE or attention blocks into cosine layers; lit_amp replaces only
   the head, which is what the documentation describes.
3. **Gradient centralization** (``gc_flag``, :func:`centralize_gradients_`): before each
   optimizer step, every conv / linear weight gradient ``g`` (``ndim >= 2``; not grouped convs,
   not the FN head, not biases or norm parameters) becomes ``g - mean(g over all dims but
   0)``. MindSpore requires grouped-parameter optimizers for this; lit_amp uses an optimizer
   step pre-hook, so it works with any optimizer.

Example:
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    >>> _ = replace_head_with_fn(net)
    >>> type(net[2]).__name__
    'CommonHeadLastFN'
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lit_amp.boost.base import BoostAlgorithm

__all__ = [
    "CommonHeadLastFN",
    "LessBN",
    "remove_residual_bn",
    "replace_head_with_fn",
    "gc_parameters",
    "centralize_gradients_",
    "apply_less_bn",
]

log = logging.getLogger(__name__)

_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_ACT_MODULES = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Hardswish)
_ACT_FUNCS = {F.relu, torch.relu, F.relu6, F.leaky_relu, F.gelu, F.silu, F.elu}
_ACT_METHODS = {"relu", "relu_"}
_ADD_FUNCS = {operator.add, operator.iadd, torch.add}
_MARK = "_lit_amp_less_bn"


class CommonHeadLastFN(nn.Module):
    r"""The normalized last layer: ``y = multiplier * (normalize(x) @ normalize(W)^T [+ b])``.

    ``normalize`` is the L2 normalization over dim 1 (each input row; each weight row).

    Args:
        in_channels: input features.
        out_channels: output features.
        weight: the initial weight ``[out, in]``; a Parameter is used as-is (same object, so an
            optimizer holding it keeps working), a tensor is copied. None: normal init.
        has_bias: add a bias (False when converting a head, as MindSpore does).
        bias: the initial bias when ``has_bias``.

    Example:
        >>> head = CommonHeadLastFN(4, 3)
        >>> head(torch.randn(2, 4)).abs().max() <= 1.0   # cosines times m = 1
        tensor(True)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        weight: torch.Tensor | None = None,
        has_bias: bool = False,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        if isinstance(weight, nn.Parameter):
            self.weight = weight
        elif weight is not None:
            self.weight = nn.Parameter(weight.detach().clone())
        else:
            self.weight = nn.Parameter(torch.randn(out_channels, in_channels) * 0.01)
        if tuple(self.weight.shape) != (out_channels, in_channels):
            raise ValueError(
                f"CommonHeadLastFN: 'weight' must have shape {(out_channels, in_channels)}, but "
                f"got {tuple(self.weight.shape)}."
            )
        self.multiplier = nn.Parameter(
            torch.ones(1, dtype=self.weight.dtype, device=self.weight.device)
        )
        if has_bias:
            b = torch.zeros(out_channels) if bias is None else bias.detach().clone()
            self.bias: nn.Parameter | None = nn.Parameter(
                b.to(self.weight.device, self.weight.dtype)
            )
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if x.dtype != w.dtype:  # the head may sit after AMP-converted layers
            x = x.to(w.dtype)
        y = F.normalize(x, dim=1) @ F.normalize(w, dim=1).t()
        if self.bias is not None:
            y = y + self.bias
        return self.multiplier * y

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}, out_channels={self.out_channels}, " + (
            f"has_bias={self.bias is not None}"
        )


def _set_submodule(root: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    setattr(parent, name, new)


def replace_head_with_fn(network: nn.Module) -> tuple[CommonHeadLastFN, list[nn.Parameter]] | None:
    """Replace the network's last ``nn.Linear`` with :class:`CommonHeadLastFN` (in place).

    Returns:
        ``(new_head, dropped_params)`` — the dropped params are the old bias (if any) — or None
        when the network has no Linear (or is itself the Linear: it cannot be replaced in
        place; a warning is logged).

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 3))
        >>> head, dropped = replace_head_with_fn(net)
        >>> head.weight is not None, len(dropped)
        (True, 1)
    """
    last = None
    for name, m in network.named_modules():
        if type(m) is nn.Linear:
            last = (name, m)
    if last is None:
        return None
    name, lin = last
    if name == "":
        log.warning("LessBN: the network itself is a Linear; the FN head cannot replace it.")
        return None
    head = CommonHeadLastFN(lin.in_features, lin.out_features, lin.weight, has_bias=False)
    _set_submodule(network, name, head)
    dropped = [lin.bias] if lin.bias is not None else []
    return head, dropped


# ------------------------------------------------------------------ BN removal
def _is_add(node: Any) -> bool:
    if node.op == "call_function" and node.target in _ADD_FUNCS:
        return True
    return node.op == "call_method" and node.target in ("add", "add_", "__add__", "__iadd__")


def _kind(node: Any, modules: dict[str, nn.Module]) -> str | None:
    if node.op == "call_module":
        m = modules.get(node.target)
        if isinstance(m, _BN):
            return "bn"
        if isinstance(m, _CONV):
            return "conv"
        if isinstance(m, _ACT_MODULES):
            return "act"
        return None
    if node.op == "call_function" and node.target in _ACT_FUNCS:
        return "act"
    if node.op == "call_method" and node.target in _ACT_METHODS:
        return "act"
    return None


def _walk_branch(start: Any, modules: dict[str, nn.Module]) -> tuple[list[Any], Any]:
    """Walk back from ``start`` through conv/bn/activation nodes; returns (chain, fork)."""
    chain: list[Any] = []
    node = start
    while True:
        kind = _kind(node, modules)
        if kind is None:
            return chain, node
        chain.append(node)
        src = node.args[0] if node.args else None
        if not hasattr(src, "users"):
            return chain, src
        if len(src.users) > 1:  # the block input: shared with the shortcut
            return chain, src
        node = src


def _residual_bn_targets(network: nn.Module) -> list[str]:
    """Module paths of the BatchNorms that MindSpore's less-BN pass would remove."""
    import torch.fx

    gm = torch.fx.symbolic_trace(network)
    modules = dict(network.named_modules())
    remove: list[str] = []
    for node in gm.graph.nodes:
        if not _is_add(node):
            continue
        args = [a for a in node.args[:2] if hasattr(a, "users")]
        if len(args) != 2:
            continue
        walks = [_walk_branch(a, modules) for a in args]
        (chain_a, fork_a), (chain_b, fork_b) = walks
        # residual: both branches start at the same fork, or one branch *is* the fork
        same = fork_a is fork_b or args[1] is fork_a or args[0] is fork_b
        if not same:
            continue
        n_conv = [sum(_kind(n, modules) == "conv" for n in c) for c in (chain_a, chain_b)]
        main = 0 if n_conv[0] >= n_conv[1] else 1
        chain = walks[main][0]
        if n_conv[main] < 2 or n_conv[1 - main] >= 2:
            continue
        bns = [n for n in chain if _kind(n, modules) == "bn"]
        if not bns or chain[0] is not bns[0]:  # the branch must end in BN -> Add
            continue
        remove.extend(n.target for n in bns[1:])
    return remove


def _find_targets(module: nn.Module, prefix: str, failures: list[str]) -> list[str]:
    """Trace ``module``; where it cannot be traced, trace its children instead."""
    try:
        found = _residual_bn_targets(module)
    except Exception as exc:  # torch.fx cannot trace data-dependent control flow etc.
        children = list(module.named_children())
        if not children:
            return []
        failures.append(f"{prefix or type(module).__name__}: {type(exc).__name__}")
        out: list[str] = []
        for name, child in children:
            out.extend(_find_targets(child, f"{prefix}{name}.", failures))
        return out
    return [prefix + t for t in found]


def remove_residual_bn(network: nn.Module) -> list[str]:
    """Remove the inner BatchNorms of residual branches, in place (see the module docstring).

    The network is traced with ``torch.fx``; a module whose forward cannot be traced (data-
    dependent control flow) is searched through its children instead, so residual blocks are
    found as long as the blocks themselves are traceable.

    Returns:
        The module paths that became ``nn.Identity`` (empty when nothing matched).

    Example:
        >>> from lit_amp.demos import ResNet1D
        >>> remove_residual_bn(ResNet1D(channels=8, blocks=(1, 1)))
        ['layers.0.bn1', 'layers.1.bn1']
    """
    failures: list[str] = []
    targets = _find_targets(network, "", failures)
    if failures:
        log.debug("LessBN: torch.fx could not trace %s; searched their children.", failures)
    done: list[str] = []
    for path in dict.fromkeys(targets):
        _set_submodule(network, path, nn.Identity())
        done.append(path)
    return done


# ------------------------------------------------------------------ gradient centralization
def gc_parameters(network: nn.Module) -> list[nn.Parameter]:
    """The parameters gradient centralization applies to.

    Weights (``ndim >= 2``) of ungrouped conv layers and of ``nn.Linear`` layers; not biases,
    not normalization parameters, not grouped convs, not :class:`CommonHeadLastFN`.

    Example:
        >>> len(gc_parameters(nn.Sequential(nn.Conv1d(1, 4, 3), nn.BatchNorm1d(4))))
        1
    """
    out: list[nn.Parameter] = []
    seen: set[int] = set()
    for m in network.modules():
        if isinstance(m, _CONV) and m.groups == 1 or isinstance(m, nn.Linear):
            w = m.weight
            if w is not None and w.requires_grad and w.dim() >= 2 and id(w) not in seen:
                seen.add(id(w))
                out.append(w)
    return out


def centralize_gradients_(params: Iterable[torch.Tensor]) -> None:
    """``g -= mean(g, dims 1..n)`` for each parameter's gradient, in place.

    Example:
        >>> w = nn.Parameter(torch.zeros(2, 3)); w.grad = torch.tensor([[1., 2., 3.], [0., 0., 3.]])
        >>> centralize_gradients_([w]); w.grad
        tensor([[-1.,  0.,  1.],
                [-1., -1.,  2.]])
    """
    for p in params:
        g = p.grad
        if g is None or g.dim() < 2 or g.is_sparse:
            continue
        g.sub_(g.mean(dim=tuple(range(1, g.dim())), keepdim=True))


def apply_less_bn(
    network: nn.Module, fn_flag: bool = True, *, remove_bn: bool = True
) -> dict[str, Any]:
    """The network part of LessBN (BN reduction + FN head), in place and idempotent.

    Returns:
        ``{"removed_bn": [paths], "head": CommonHeadLastFN | None, "dropped": [params],
        "added": [params]}`` (empty when the network was already processed).

    Example:
        >>> from lit_amp.demos import ResNet1D
        >>> info = apply_less_bn(ResNet1D(channels=8, blocks=(1,)))
        >>> info["removed_bn"], type(info["head"]).__name__
        (['layers.0.bn1'], 'CommonHeadLastFN')
    """
    info: dict[str, Any] = {"removed_bn": [], "head": None, "dropped": [], "added": []}
    if getattr(network, _MARK, False):
        return info
    before = {id(p): p for p in network.parameters()}
    if remove_bn:
        info["removed_bn"] = remove_residual_bn(network)
    if fn_flag:
        res = replace_head_with_fn(network)
        if res is not None:
            info["head"] = res[0]
    after = {id(p): p for p in network.parameters()}
    info["dropped"] = [p for i, p in before.items() if i not in after]
    info["added"] = [p for i, p in after.items() if i not in before]
    object.__setattr__(network, _MARK, True)
    return info


def _sync_optimizer(
    optimizer: torch.optim.Optimizer,
    dropped: Sequence[nn.Parameter],
    added: Sequence[nn.Parameter],
    anchor: nn.Parameter | None,
) -> None:
    """Drop removed params from ``optimizer``; add new ones to the group holding ``anchor``."""
    drop = {id(p) for p in dropped}
    have: set[int] = set()
    target = None
    for group in optimizer.param_groups:
        if drop:
            group["params"] = [p for p in group["params"] if id(p) not in drop]
        have.update(id(p) for p in group["params"])
        if anchor is not None and any(p is anchor for p in group["params"]):
            target = group
    for p in dropped:
        optimizer.state.pop(p, None)
    if target is None:
        return  # the optimizer does not train the head: leave it alone
    for p in added:
        if id(p) not in have:
            target["params"].append(p)


class LessBN(BoostAlgorithm):
    """LessBN as a Lightning callback (and its pure-torch parts).

    Args:
        fn_flag: replace the head with :class:`CommonHeadLastFN`.
        gc_flag: gradient centralization of conv / linear weights before every optimizer step.
        remove_bn: remove the inner BatchNorms of residual branches (MindSpore always does;
            off only for ablations).

    Side effects: network surgery before AMP and DDP wrapping (``setup``); the new multiplier
    joins, and removed parameters leave, the optimizer group that holds the head's weight.

    Example:
        >>> import lightning as L
        >>> cb = LessBN(fn_flag=True, gc_flag=True)
        >>> trainer = L.Trainer(callbacks=[cb], max_epochs=1, logger=False)  # doctest: +SKIP
    """

    name = "less_bn"

    def __init__(self, fn_flag: bool = True, gc_flag: bool = True, *, remove_bn: bool = True):
        for arg, v in (("fn_flag", fn_flag), ("gc_flag", gc_flag), ("remove_bn", remove_bn)):
            if not isinstance(v, bool):
                raise TypeError(f"LessBN: '{arg}' must be a bool, but got {v!r}.")
        self.fn_flag = fn_flag
        self.gc_flag = gc_flag
        self.remove_bn = remove_bn
        self.removed_bn: list[str] = []
        self._dropped: list[nn.Parameter] = []
        self._added: list[nn.Parameter] = []
        self._head: CommonHeadLastFN | None = None
        self._handles: list[Any] = []

    def apply_to_network(self, network: nn.Module) -> nn.Module:
        info = apply_less_bn(network, self.fn_flag, remove_bn=self.remove_bn)
        if info["head"] is None and not info["removed_bn"] and not info["dropped"]:
            return network  # already processed (or nothing to do)
        self.removed_bn = info["removed_bn"]
        self._head = info["head"]
        self._dropped = info["dropped"]
        self._added = info["added"]
        if self.removed_bn:
            log.info(
                "LessBN: removed %d BatchNorm layers: %s", len(self.removed_bn), self.removed_bn
            )
        return network

    def apply_to_eval_network(self, network: nn.Module) -> nn.Module:
        """The evaluation network gets the same surgery (MindSpore's
        ``network_auto_process_eval``)."""
        return self.apply_to_network(network)

    def sync_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Bring ``optimizer`` in line with the surgery (idempotent); returns it."""
        anchor = self._head.weight if self._head is not None else None
        _sync_optimizer(optimizer, self._dropped, self._added, anchor)
        return optimizer

    def attach(
        self, network: nn.Module, optimizers: Sequence[torch.optim.Optimizer], **context: Any
    ) -> None:
        self.detach()
        if self._head is None:  # processed earlier (e.g. by another instance): find the head
            heads = [m for m in network.modules() if isinstance(m, CommonHeadLastFN)]
            if heads:
                self._head = heads[-1]
                self._added = list(self._head.parameters())
        for opt in optimizers:
            self.sync_optimizer(opt)
        if not self.gc_flag:
            return
        gc = gc_parameters(network)
        if self._head is not None:
            gc = [p for p in gc if p is not self._head.weight]
        for opt in optimizers:
            own = {id(p) for g in opt.param_groups for p in g["params"]}
            params = [p for p in gc if id(p) in own]
            if params:
                self._handles.append(
                    opt.register_step_pre_hook(_GCHook(params))
                )

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


class _GCHook:
    """Optimizer step pre-hook: gradient centralization of ``params``."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        centralize_gradients_(self.params)
