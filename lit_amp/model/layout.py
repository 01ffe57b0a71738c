"""Parameter sharding layouts for ``Model.infer_train_layout`` / ``infer_predict_layout``.

MindSpore compiles the parallel graph and reports each parameter's layout. Here a layout is
read from the parameters themselves: a ``DTensor`` (``fully_shard``, tensor parallelism) gives
its placements and mesh, a parameter inside an FSDP1 flat parameter its slice of the flat
shard, any other parameter is replicated. When the network is not sharded yet, the Model's
strategy is set up by one Trainer call that stops before the first step, and the layouts are
read from the module the strategy built.
"""

from __future__ import annotations

import copy
from typing import Any

import lightning as L
import torch
from torch import nn

from lit_amp._runtime import dist_ready
from lit_amp.model._lightning import quiet_lightning
from lit_amp.model.data_checks import check_dataset, for_lightning

__all__ = ["infer_layouts", "read_layouts"]

_SHARDED_NAMES = ("fsdp", "modelparallel", "model_parallel")


def _fsdp1() -> Any:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - torch without FSDP
        return ()
    return FullyShardedDataParallel


def _rank() -> int:
    return torch.distributed.get_rank() if dist_ready() else 0


def _flat_shards(modules: list[nn.Module]) -> dict[int, tuple[list[int], int]]:
    """FSDP1 (``use_orig_params``): ``id(parameter) -> (its shape, numel of its flat slice)``."""
    fsdp1 = _fsdp1()
    flat: dict[int, tuple[list[int], int]] = {}
    for m in modules:
        handle = getattr(m, "_handle", None) if isinstance(m, fsdp1) else None
        fp = getattr(handle, "flat_param", None)
        for p, shape in zip(getattr(fp, "_params", None) or [],
                            getattr(fp, "_shapes", None) or []):
            flat[id(p)] = (list(shape), int(p.numel()))
    return flat


def _layout(placements: list[str], mesh: list[int], names: list[str], global_shape: list[int],
            local_shape: list[int]) -> dict[str, Any]:
    return {
        "placements": placements,
        "device_mesh": mesh,
        "mesh_dim_names": names,
        "global_shape": global_shape,
        "local_shape": local_shape,
        "rank": _rank(),
    }


def read_layouts(network: nn.Module, modules: list[nn.Module]) -> dict[str, dict[str, Any]]:
    """Each parameter of ``network``: its layout, as the sharded ``modules`` hold it.

    Args:
        network: the user's network (its parameter names are the keys).
        modules: the modules of the (possibly FSDP-wrapped) model that holds the parameters.

    Returns:
        ``{parameter name: {"placements", "device_mesh", "mesh_dim_names", "global_shape",
        "local_shape", "rank"}}``.

    Example:
        >>> read_layouts(nn.Linear(2, 3), [])["weight"]["placements"]
        ['Replicate()']
    """
    from torch.distributed.tensor import DTensor

    flat = _flat_shards(modules)
    out = {}
    for pname, p in network.named_parameters():
        if isinstance(p, DTensor):
            mesh = p.device_mesh
            out[pname] = _layout([repr(pl) for pl in p.placements], list(mesh.shape),
                                 list(mesh.mesh_dim_names or ()), list(p.shape),
                                 list(p.to_local().shape))
        elif id(p) in flat:
            shape, numel = flat[id(p)]
            dist_on = dist_ready()
            world = torch.distributed.get_world_size() if dist_on else 1
            out[pname] = _layout(["Shard(flat)"], [world], [], shape, [numel])
        else:
            out[pname] = _layout(["Replicate()"], [], [], list(p.shape), list(p.shape))
    return out


def _is_sharded(network: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    fsdp1 = _fsdp1()
    return any(isinstance(p, DTensor) for p in network.parameters()) or any(
        isinstance(m, fsdp1) for m in network.modules()
    )


class _Capture(L.Callback):
    """Reads the layouts once the strategy has set the model up, then stops the call."""

    def __init__(self, network: nn.Module) -> None:
        self.network = network
        self.layouts: dict[str, Any] = {}

    def _grab(self, trainer: L.Trainer) -> None:
        self.layouts.update(read_layouts(self.network, list(trainer.strategy.model.modules())))
        trainer.should_stop = True

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._grab(trainer)

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._grab(trainer)


def infer_layouts(api: str, module: L.LightningModule, network: nn.Module,
                  trainer_kwargs: dict[str, Any], data: Any) -> dict[str, dict[str, Any]]:
    """The layouts behind ``Model.infer_train_layout`` / ``Model.infer_predict_layout``.

    Args:
        api: ``"infer_train_layout"`` (data: a train dataset) or ``"infer_predict_layout"``
            (data: a tuple of predict inputs).
        module: the ``LitModel`` the strategy sets up.
        network: its backbone.
        trainer_kwargs: the Model's full ``Trainer`` arguments (defaults included).
        data: see ``api``.

    Returns:
        See :func:`read_layouts`.

    Raises:
        RuntimeError: no sharded strategy and no sharded parameters, or the layouts were
            computed in spawned worker processes.
    """
    strategy = trainer_kwargs.get("strategy")
    name = (strategy if isinstance(strategy, str) else type(strategy).__name__).lower()
    already = _is_sharded(network)
    if not (any(k in name for k in _SHARDED_NAMES) or already):
        raise RuntimeError(
            f"{api}: parameter layouts need a sharded strategy (trainer={{'strategy': "
            "'fsdp'} or a "
            "ModelParallelStrategy) or a network with sharded (DTensor) parameters, as "
            "MindSpore needs (semi-)auto parallel; got strategy="
            f"{strategy if strategy is not None else None!r}."
        )
    if already:
        return read_layouts(network, list(network.modules()))
    capture = _Capture(network)
    kw = {**trainer_kwargs, "logger": False}
    if not isinstance(strategy, str) and strategy is not None:
        # a Strategy object serves one Trainer: set up a copy, leaving the Model's own unbound
        # for its later calls (train, eval, another layout)
        kw["strategy"] = copy.deepcopy(strategy)
    callbacks = [capture, *(kw.pop("callbacks", None) or [])]
    with quiet_lightning():
        if api == "infer_train_layout":
            check_dataset(data, "train_dataset")
            trainer = L.Trainer(callbacks=callbacks, max_steps=0, **kw)
            trainer.fit(module, train_dataloaders=for_lightning(data))
        else:
            trainer = L.Trainer(callbacks=callbacks, **kw)
            trainer.predict(module, dataloaders=[tuple(data)], return_predictions=False)
    if not capture.layouts:
        raise RuntimeError(
            f"{api}: the layout was computed in worker processes this process cannot read "
            "(a spawn-based launcher); run the script under torchrun / srun or Lightning's "
            "default launcher."
        )
    return capture.layouts
