"""FSDP2 (``fully_shard``) sharded data parallelism for ``Model`` and ``LitModel``.

Lightning's ``ModelParallelStrategy`` reduces gradients only for parameters parallelized in
``configure_model``; :func:`prepare_sharded`, called there by ``LitModel``, shards a plain
network itself (each direct child holding parameters, except norms and children sharing a
weight, then the root), re-points the user's optimizer at the sharded parameters and checks
ownership both ways. THOR and boost levels are refused; mixed precision is lit_amp's own
conversion, applied before sharding. Evaluation gathers the parameters once per pass.
``"fsdp2"`` is registered as a Lightning strategy name (:class:`FSDP2Strategy`). The rules
and their reasons: docs/differences.md, "Sharded training is FSDP2".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from torch import nn

from lit_amp._runtime import dist_ready

__all__ = [
    "FSDP2Strategy",
    "broadcast_buffers",
    "check_optimizer_owns",
    "gathered",
    "is_fsdp2",
    "is_sharded",
    "is_sharded_strategy",
    "no_grad_sync",
    "prepare_sharded",
    "shard_network",
]

_NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm)
_WAY_OUT = "Train with strategy 'ddp' instead."


class FSDP2Strategy(ModelParallelStrategy):
    """``ModelParallelStrategy`` as pure FSDP2 data parallelism over every process.

    ``data_parallel_size`` is the world size and ``tensor_parallel_size`` 1, whatever the
    number of devices and nodes; checkpoints are gathered into one file on rank 0 by default
    (``save_distributed_checkpoint=False``), the format lit_amp and single-process loading
    read. Registered as ``"fsdp2"``.

    Args:
        save_distributed_checkpoint: as ``ModelParallelStrategy``'s (default False here).
        **kwargs: ``process_group_backend``, ``timeout``.

    Example:
        >>> FSDP2Strategy()._tensor_parallel_size
        1
    """

    strategy_name = "fsdp2"

    def __init__(self, save_distributed_checkpoint: bool = False, **kwargs: Any) -> None:
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1,
                         save_distributed_checkpoint=save_distributed_checkpoint, **kwargs)

    def setup_environment(self) -> None:
        self._data_parallel_size = max(1, self.num_nodes * self.num_processes)
        super().setup_environment()


if "fsdp2" not in StrategyRegistry:
    StrategyRegistry.register(
        "fsdp2", FSDP2Strategy,
        description="FSDP2 (fully_shard) data parallelism; lit_amp shards the network itself",
    )


def is_fsdp2(strategy: Any) -> bool:
    """Whether ``strategy`` is a ``ModelParallelStrategy`` (FSDP2 / DTensor parallelism).

    Example:
        >>> is_fsdp2(FSDP2Strategy()), is_fsdp2("ddp")
        (True, False)
    """
    return isinstance(strategy, ModelParallelStrategy)


def is_sharded_strategy(strategy: Any) -> bool:
    """Whether ``strategy`` (a name or a Strategy) shards parameters (FSDP, FSDP2, DTensor).

    Example:
        >>> is_sharded_strategy("fsdp2"), is_sharded_strategy("ddp"), is_sharded_strategy(None)
        (True, False, False)
    """
    name = strategy if isinstance(strategy, str) else type(strategy).__name__
    return any(k in name.lower() for k in ("fsdp", "modelparallel"))


def is_sharded(module: nn.Module) -> bool:
    """Whether any parameter of ``module`` is a ``DTensor`` (sharded or parallelized).

    Example:
        >>> is_sharded(nn.Linear(2, 2))
        False
    """
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def _holds_params(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _tied_children(network: nn.Module) -> set[str]:
    """Names of ``network``'s direct children that share a parameter with another part of it
    (a tied embedding and head, or a child registered twice); ``""`` stands for the root.

    Example:
        >>> net = nn.Sequential(nn.Embedding(4, 2), nn.Linear(2, 2), nn.Linear(2, 4, bias=False))
        >>> net[2].weight = net[0].weight
        >>> sorted(_tied_children(net))
        ['0', '2']
    """
    owners: dict[int, set[str]] = {}
    for name, p in network.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), set()).add(name.split(".", 1)[0] if "." in name else "")
    return {o for s in owners.values() if len(s) > 1 for o in s}


def shard_network(network: nn.Module, mesh: Any) -> dict[int, nn.Parameter]:
    """``fully_shard`` the network by the module rule; returns ``{id(old param): new param}``.

    Args:
        network: an unsharded network.
        mesh: the 1-D data-parallel ``DeviceMesh``.

    Returns:
        The old parameters' ids mapped to the sharded parameters that replaced them.
    """
    from torch.distributed.fsdp import fully_shard

    names = {id(p): n for n, p in network.named_parameters()}
    tied = _tied_children(network)
    for name, child in network.named_children():
        if _holds_params(child) and not isinstance(child, _NORMS) and name not in tied:
            fully_shard(child, mesh=mesh, reshard_after_forward=True)
    # the root reshards too (its few parameters are gathered again in backward): outside a
    # forward/backward every parameter is a DTensor, also after an eval or predict forward
    fully_shard(network, mesh=mesh, reshard_after_forward=True)
    new = dict(network.named_parameters())
    return {pid: new[name] for pid, name in names.items() if name in new}


def _shard_state(value: Any, old: torch.Tensor, new: Any) -> Any:
    """An optimizer state entry of ``old``'s shape, sharded as ``new``; others unchanged."""
    from torch.distributed.tensor import distribute_tensor

    if torch.is_tensor(value) and value.shape == old.shape and value.dim() > 0:
        return distribute_tensor(value.to(new.device), new.device_mesh, new.placements)
    return value


def _repoint_optimizer(optimizer: torch.optim.Optimizer, mapping: dict[int, nn.Parameter]) -> None:
    """Re-point ``optimizer``'s param groups (and state) at the sharded parameters, in place."""
    olds = {id(p): p for g in optimizer.param_groups for p in g["params"]}
    for group in optimizer.param_groups:
        group["params"] = [mapping.get(id(p), p) for p in group["params"]]
    for pid, new in mapping.items():
        old = olds.get(pid)
        if old is not None and old in optimizer.state:
            st = optimizer.state.pop(old)
            optimizer.state[new] = {k: _shard_state(v, old, new) for k, v in st.items()}


def check_optimizer_owns(optimizer: torch.optim.Optimizer | None, model: nn.Module) -> None:
    """Refuse an optimizer holding a parameter that is not a sharded parameter of ``model``,
    or missing a trainable parameter of ``model``.

    Args:
        optimizer: the optimizer (None: nothing to check).
        model: the LightningModule whose parameters FSDP2 reduces.

    Raises:
        ValueError: a parameter of ``optimizer`` is not one of ``model``'s, or is not sharded;
            a parameter of ``model`` with ``requires_grad`` is not in ``optimizer``.

    Example:
        >>> net = nn.Linear(2, 2)
        >>> check_optimizer_owns(torch.optim.SGD(nn.Linear(2, 2).parameters(), 0.1), net)
        Traceback (most recent call last):
        ...
        ValueError: For 'Model'/'LitModel', the argument 'optimizer' must hold the model's ...
    """
    if optimizer is None:
        return
    from torch.distributed.tensor import DTensor

    own = {id(p) for p in model.parameters()}
    params = [p for g in optimizer.param_groups for p in g["params"]]
    foreign = sum(id(p) not in own for p in params)
    plain = sum(id(p) in own and not isinstance(p, DTensor) for p in params)
    if foreign or plain:
        raise ValueError(
            "For 'Model'/'LitModel', the argument 'optimizer' must hold the model's sharded "
            f"parameters under FSDP2, but {foreign} of its {len(params)} parameters are not "
            f"the model's and {plain} are not sharded (DTensor): it would update tensors the "
            "model no longer uses and nothing would train. Build the optimizer over "
            "network.parameters() *before* sharding and let lit_amp shard the network (pass "
            "the plain network with strategy 'fsdp2'), or, if you apply fully_shard yourself, "
            "build the optimizer after it."
        )
    held = {id(p) for p in params}
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in held]
    if missing:
        shown = ", ".join(repr(n) for n in missing[:4]) + (", ..." if len(missing) > 4 else "")
        raise ValueError(
            "For 'Model'/'LitModel', the argument 'optimizer' must hold every trainable "
            f"parameter of the model under FSDP2, but {len(missing)} are not in the optimizer "
            f"({shown}): they would get gradients and never change. Build the optimizer over "
            "network.parameters(), or set requires_grad=False on the parameters to freeze."
        )


def _refuse_unsupported(lit: Any) -> None:
    from lit_amp.thor.optimizer import THOR

    if isinstance(lit.optimizer, THOR):
        raise ValueError(
            "For 'Model'/'LitModel', the argument 'optimizer' must not be THOR under FSDP2 "
            "(ModelParallelStrategy): THOR's second-order statistics need each layer's full "
            f"weights and gradients on every rank. {_WAY_OUT}"
        )
    if lit.boost is not None:
        raise ValueError(
            "For 'Model'/'LitModel', the argument 'boost_level' must be 'O0' under FSDP2 "
            f"(ModelParallelStrategy), but got {lit.boost_level!r}: the boost algorithms work "
            f"on DDP's full gradients. {_WAY_OUT}"
        )


def prepare_sharded(lit: Any, strategy: ModelParallelStrategy, *, fitting: bool) -> bool:
    """``LitModel.configure_model`` under a ``ModelParallelStrategy``: shard, re-point, check.

    Args:
        lit: the ``LitModel`` (its ``network``, ``optimizer``, ``boost``).
        strategy: the Trainer's ``ModelParallelStrategy`` (its ``device_mesh`` is set up).
        fitting: whether the call trains (then the optimizer must own the parameters).

    Returns:
        True when this call sharded the network, False when it already was sharded.

    Raises:
        ValueError: THOR or a boost level; ``tensor_parallel_size > 1`` without a parallelized
            network; an optimizer that does not hold the sharded parameters (when fitting).
    """
    _refuse_unsupported(lit)
    network = lit.network
    done = False
    if not is_sharded(network):
        mesh = strategy.device_mesh
        if "tensor_parallel" in (mesh.mesh_dim_names or ()) and mesh["tensor_parallel"].size() > 1:
            raise ValueError(
                "For 'Model'/'LitModel', the argument 'strategy' is a ModelParallelStrategy "
                f"with tensor_parallel_size={mesh['tensor_parallel'].size()} but the network "
                "is not parallelized: lit_amp shards plain networks over the data-parallel "
                "dimension only. Use ModelParallelStrategy(data_parallel_size=<world size>, "
                "tensor_parallel_size=1) or strategy 'fsdp2', or apply your tensor-parallel "
                "plan before training."
            )
        dp = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
        mapping = shard_network(network, dp)
        if lit.optimizer is not None:
            _repoint_optimizer(lit.optimizer, mapping)
        done = True
    if fitting:
        check_optimizer_owns(lit.optimizer, lit)
    return done


def _fsdp_modules(network: nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in network.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(network: nn.Module) -> Iterator[None]:
    """Hold ``network``'s FSDP2 parameters unsharded for a whole evaluation pass.

    All ranks gather once on entry and reshard on exit (collectives every rank runs the same
    number of times), so forwards inside the block run no collective: a rank with fewer
    evaluation batches than another, or none, leaves nobody waiting. No-op for a network
    without FSDP2 modules.

    Example:
        >>> with gathered(nn.Linear(2, 2)):
        ...     pass
    """
    mods = _fsdp_modules(network)
    if not mods:
        yield
        return
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in mods:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)


def broadcast_buffers(network: nn.Module) -> None:
    """Rank 0's buffers (BatchNorm statistics) to every rank, under FSDP2.

    FSDP2 shards parameters only; each rank's buffers follow its own batches. DDP broadcasts
    rank 0's before each forward; taking rank 0's after training gives the same result.

    Example:
        >>> broadcast_buffers(nn.BatchNorm1d(2))  # no FSDP2 module: nothing to do
    """
    if not _fsdp_modules(network) or not dist_ready():
        return
    for buf in network.buffers():
        torch.distributed.broadcast(buf, src=0)


@contextlib.contextmanager
def no_grad_sync(ddp: Any, network: nn.Module, *, skip: bool) -> Iterator[None]:
    """With ``skip``: backward passes in the block leave the gradients unreduced (local sums).

    Gradient accumulation's micro-steps before the last: DDP's ``require_backward_grad_sync``
    (what ``DistributedDataParallel.no_sync`` sets; Lightning's manual backward reads it) is
    off, FSDP2's ``set_requires_gradient_sync(False)``; the last micro-step's backward then
    reduces the accumulated sums once. A DDP whose sync is already off (AdaSum) is left so.

    Args:
        ddp: the ``DistributedDataParallel`` wrapper, or None.
        network: the network (FSDP2 when it is an ``FSDPModule``).
        skip: whether to skip the reduction in the block (False: nothing changes).

    Example:
        >>> with no_grad_sync(None, nn.Linear(2, 2), skip=True):
        ...     pass
    """
    from torch.distributed.fsdp import FSDPModule

    if skip and ddp is not None and ddp.require_backward_grad_sync:
        ddp.require_backward_grad_sync = False
        try:
            yield
        finally:
            ddp.require_backward_grad_sync = True
    elif skip and isinstance(network, FSDPModule):
        network.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            network.set_requires_gradient_sync(True)
    else:
        yield
