"""AdaSum as a Lightning callback: combine the data-parallel ranks' weight updates adaptively.

MindSpore's ``boost.AdaSum`` (docs/semantics.md §3.3). Each rank takes its optimizer step on
its **own** gradients; the weight deltas are then combined by AdaSum (:mod:`.maths`) and every
rank applies the result (:class:`~lit_amp.boost.adasum.hooks.AdaSumHooks`).

``local_size`` mirrors MindSpore's nodes: gradients are averaged inside each block of
``local_size`` consecutive ranks (MindSpore: the 8 devices of a node), and AdaSum combines the
blocks. MindSpore switches AdaSum on only for >= 2 nodes of 8 devices (>= 16 devices), so on
one machine its O2 equals O1; lit_amp combines across all data-parallel ranks when
``local_size`` does not divide the world into >= 2 blocks (``local_size=1``: every rank is a
block), which makes it usable -- and testable -- with 2 CPU processes. Any world size works
(an odd block is carried up the tree); MindSpore needs a power of two.

With every rank its own block, DDP's gradient synchronisation is switched off for the fit
(each rank keeps its own gradients; the floating buffers DDP would broadcast, BatchNorm's
running statistics, are averaged in AdaSum's own exchange instead); with blocks, a DDP
communication hook replaces DDP's averaging by a block-local mean.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lit_amp._runtime import dist_ready
from lit_amp.boost.adasum.hooks import AdaSumHooks, local_mean_comm_hook, resync_ddp, unsync_ddp
from lit_amp.boost.adasum.shm import ShmAllGather
from lit_amp.boost.base import BoostAlgorithm

if TYPE_CHECKING:
    from lit_amp.boost.config import BoostConfig

__all__ = ["AdaSum"]

log = logging.getLogger(__name__)


class AdaSum(BoostAlgorithm):
    """AdaSum across data-parallel ranks as a Lightning callback.

    Works with Lightning's DDP strategies (``ddp``, ``ddp_spawn``, CPU/gloo or GPU/nccl): at
    fit start it registers a DDP communication hook (no averaging, or a block-local mean) and
    the optimizer step hooks. With one process it does nothing.

    Args:
        local_size: ranks per block (MindSpore's ``device_number``); used only when it splits
            the world into >= 2 equal blocks, else every rank is its own block.
        transport: how the weight deltas travel: ``"process_group"``: vector halving through
            ``torch.distributed`` point-to-point sends (~2N floats sent per rank for any number
            of ranks; gloo or NCCL, any number of hosts; with 2 ranks one all-gather);
            ``"shm"``: an all-gather through shared memory (ranks on one x86-64 host, gloo on
            CPU; memory and traffic grow with ranks x parameters; ValueError when it cannot be
            used); ``"auto"`` (default): ``"shm"`` for exactly 2 ranks where it can be used
            (measured faster there: ``docs/benchmarks.md``, "AdaSum traffic"), else
            ``"process_group"``. Results agree within float rounding (1e-6 relative).

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn",
        ...                     callbacks=[AdaSum()])  # doctest: +SKIP
    """

    name = "adasum"

    TRANSPORTS = ("auto", "shm", "process_group")

    def __init__(self, local_size: int = 1, transport: str = "auto") -> None:
        if isinstance(local_size, bool) or not isinstance(local_size, int) or local_size < 1:
            raise ValueError(f"AdaSum: 'local_size' must be an int >= 1, but got {local_size!r}.")
        if transport not in self.TRANSPORTS:
            raise ValueError(
                f"AdaSum: 'transport' must be one of {list(self.TRANSPORTS)}, but got "
                f"{transport!r}."
            )
        self.local_size = local_size
        self.transport = transport
        self.transport_used: str | None = None  # what the last attach chose
        self.hooks: AdaSumHooks | None = None
        self._ddp: Any = None
        self._ddp_class: Any = None
        self.active = False
        self.steps = 0  # AdaSum-combined optimizer steps (finished attachments)

    @classmethod
    def from_boost_config(cls, config: BoostConfig) -> AdaSum:
        """``AdaSum(local_size=common.device_number)``."""
        return cls(local_size=config.section("common")["device_number"])

    def _splits(self, world: int) -> bool:
        ls = self.local_size
        return ls > 1 and world % ls == 0 and world // ls >= 2

    def unsyncs_ddp(self, world: int) -> bool:
        """Whether, over ``world`` ranks, AdaSum switches DDP's gradient synchronisation off
        (every rank its own block), so that no parameter needs DDP's unused-parameter search."""
        return world > 1 and not self._splits(world)

    def _effective_local_size(self, world: int) -> int:
        ls = self.local_size
        if self._splits(world):
            return ls
        if ls > 1:
            log.info(
                "AdaSum: local_size=%d does not split %d ranks into >= 2 blocks; combining "
                "across all ranks.",
                ls,
                world,
            )
        return 1

    def attach(
        self, network: nn.Module, optimizers: Sequence[torch.optim.Optimizer], **context: Any
    ) -> None:
        self.detach()
        if not dist_ready() or dist.get_world_size() == 1:
            return
        world, rank = dist.get_world_size(), dist.get_rank()
        ls = self._effective_local_size(world)
        trainer = context.get("trainer")
        ddp = getattr(getattr(trainer, "strategy", None), "model", None)
        buffers: list[Tensor] = []
        if isinstance(ddp, nn.parallel.DistributedDataParallel):
            if ls > 1:
                block = None
                for start in range(0, world, ls):  # every rank creates every group
                    g = dist.new_group(list(range(start, start + ls)))
                    if start <= rank < start + ls:
                        block = g
                ddp.register_comm_hook(block, local_mean_comm_hook)
            else:
                # each rank keeps its own gradients: switch DDP's gradient synchronisation off
                # altogether (no reducer work, no unused-parameter search in backward); the
                # buffers DDP would broadcast are averaged in AdaSum's own exchange instead
                self._ddp, self._ddp_class = ddp, unsync_ddp(ddp)
                buffers = [b for b in network.buffers() if b.is_floating_point()]
        else:
            log.warning(
                "AdaSum: the model is not wrapped in DistributedDataParallel; the gradients are "
                "assumed to be each rank's own."
            )
        channel = self._channel(optimizers, buffers)
        self.transport_used = "shm" if channel is not None else "process_group"
        self.hooks = AdaSumHooks(optimizers, None, ls, buffers, channel=channel)
        self.active = True

    def _channel(
        self, optimizers: Sequence[torch.optim.Optimizer], buffers: Sequence[Tensor]
    ) -> ShmAllGather | None:
        """The shared-memory exchange, when chosen and usable (collective: every rank)."""
        if self.transport == "process_group":
            return None
        if self.transport == "auto" and dist.get_world_size() != 2:
            log.info("AdaSum: %d ranks: vector halving through the process group.",
                     dist.get_world_size())
            return None
        params = [p for o in optimizers for g in o.param_groups for p in g["params"]]
        cpu = all(p.device.type == "cpu" for p in params)
        why = ""
        if dist.get_backend() != "gloo" or not cpu:
            why = "the process group is not gloo on CPU tensors"
        else:
            ok, why = ShmAllGather.usable()
            if ok:
                numel = sum(p.numel() for p in params) + sum(
                    b.numel() for b in buffers if b.is_floating_point()
                )
                try:
                    return ShmAllGather(numel)
                except RuntimeError as exc:  # raised on every rank alike
                    why = str(exc)
        if self.transport == "shm":
            raise ValueError(f"AdaSum: transport='shm' cannot be used here: {why}.")
        log.info("AdaSum: exchanging through the process group (%s).", why)
        return None

    def detach(self) -> None:
        if self._ddp is not None:
            resync_ddp(self._ddp, self._ddp_class)
            self._ddp = self._ddp_class = None
        if self.hooks is not None:
            self.steps += self.hooks.steps
            self.hooks.remove()
            self.hooks = None
        self.active = False
