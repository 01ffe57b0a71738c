"""Where AdaSum hooks into a training step: DDP's gradient communication and the optimizer step.

- DDP communication hooks: :func:`noop_comm_hook` keeps each rank's own gradients,
  :func:`local_mean_comm_hook` averages them inside a block of ranks only;
  :func:`unsync_ddp` / :func:`resync_ddp` switch DDP's gradient synchronisation off and back
  on for a whole fit (each rank its own block).
- :class:`AdaSumHooks`: optimizer step pre-/post-hooks. The pre-hook snapshots the weights;
  after each rank's local step the post-hook exchanges the weight deltas
  ``w_old - w_new`` (:func:`~lit_amp.boost.adasum.transport.exchange`) and sets
  ``w = w_old - AdaSum(deltas)`` on every rank, so weights stay identical across ranks while
  optimizer states (momentum) stay local, as in MindSpore and Horovod.

Pure torch: usable without Lightning (DDP + :func:`noop_comm_hook` + :class:`AdaSumHooks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lit_amp._runtime import dist_ready
from lit_amp.boost.adasum.maths import SegmentLayout
from lit_amp.boost.adasum.shm import ShmAllGather
from lit_amp.boost.adasum.transport import exchange

__all__ = [
    "AdaSumHooks",
    "local_mean_comm_hook",
    "noop_comm_hook",
    "resync_ddp",
    "unsync_ddp",
]


def noop_comm_hook(state: Any, bucket: Any) -> torch.futures.Future:
    """A DDP communication hook that keeps each rank's own gradients (no averaging)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def local_mean_comm_hook(process_group: Any, bucket: Any) -> torch.futures.Future:
    """A DDP communication hook averaging gradients inside ``process_group`` only."""
    buf = bucket.buffer()
    buf.div_(dist.get_world_size(process_group))
    work = dist.all_reduce(buf, group=process_group, async_op=True)
    return work.get_future().then(lambda f: f.value()[0])


# DDP checks the hooks' annotations against the real classes (not strings)
for _hook in (noop_comm_hook, local_mean_comm_hook):
    _hook.__annotations__ = {
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }


_UNSYNCED: dict[type, type] = {}


def unsync_ddp(ddp: nn.parallel.DistributedDataParallel) -> type:
    """Switch off ``ddp``'s gradient synchronisation for good; returns its class (to restore).

    Lightning (manual optimisation) and ``no_sync`` set ``require_backward_grad_sync`` back to
    ``True`` around every step; a per-instance subclass whose property ignores those writes keeps
    it off. Without it, the reducer would still bucket every gradient (and, with
    ``find_unused_parameters``, search the graph) just to hand each rank its own gradients back.
    """
    cls = type(ddp)
    sub = _UNSYNCED.get(cls)
    if sub is None:
        sub = _UNSYNCED[cls] = type(
            f"AdaSum{cls.__name__}",
            (cls,),
            {"require_backward_grad_sync": property(lambda self: False, lambda self, v: None)},
        )
    ddp.__class__ = sub
    return cls


def resync_ddp(ddp: nn.parallel.DistributedDataParallel, cls: type) -> None:
    """Undo :func:`unsync_ddp`: ``ddp`` gets its class ``cls`` back and synchronises again."""
    ddp.__class__ = cls
    ddp.require_backward_grad_sync = True
    ddp.require_forward_param_sync = True


class AdaSumHooks:
    """Optimizer step hooks applying AdaSum to each step's weight deltas (pure torch).

    Args:
        optimizers: the torch optimizers (their parameters, in order, form the delta).
        group: the process group (None: the default group).
        local_size: ranks per block whose gradients are already averaged.
        buffers: floating tensors (BatchNorm running statistics) averaged over the ranks in
            the same exchange, for when DDP no longer broadcasts them (see
            :class:`~lit_amp.boost.adasum.callback.AdaSum`).
        channel: a :class:`~lit_amp.boost.adasum.shm.ShmAllGather` for the exchange (ranks
            on one host, CPU); None: the process group.

    Example:
        >>> net = nn.Linear(2, 1); opt = torch.optim.SGD(net.parameters(), lr=0.1)
        >>> hooks = AdaSumHooks([opt])   # without torch.distributed: a no-op
        >>> hooks.remove()
    """

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        group: Any = None,
        local_size: int = 1,
        buffers: Sequence[Tensor] = (),
        channel: ShmAllGather | None = None,
    ) -> None:
        self.group = group
        self.local_size = local_size
        self.buffers = [b for b in buffers if b.is_floating_point()]
        self.channel = channel
        self.steps = 0
        self._old: dict[int, Tensor] = {}
        self._layouts: dict[tuple, SegmentLayout] = {}
        self._handles: list[Any] = []
        for opt in optimizers:
            self._handles.append(opt.register_step_pre_hook(self._pre))
            self._handles.append(opt.register_step_post_hook(self._post))

    @staticmethod
    def _params(opt: torch.optim.Optimizer) -> list[Tensor]:
        return [p for g in opt.param_groups for p in g["params"]]

    def _layout(self, params: list[Tensor]) -> SegmentLayout:
        key = tuple(id(p) for p in params)
        cached = self._layouts.get(key)
        if cached is None:
            cached = SegmentLayout([p.shape for p in params], params[0].device)
            self._layouts = {key: cached}
        return cached

    @staticmethod
    def _flat(params: list[Tensor]) -> Tensor:
        return torch.cat([p.detach().reshape(-1) for p in params]).float()

    def _pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._old[id(opt)] = self._flat(self._params(opt))

    def _post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        old = self._old.pop(id(opt), None)
        if old is None:
            return
        params = self._params(opt)
        if dist_ready() and dist.get_world_size(self.group) > 1:
            layout = self._layout(params)
            delta = old - self._flat(params)  # w_old - w_new
            bufs = self.buffers
            combined, buf_mean = exchange(
                delta, layout, self.group, self.local_size, bufs, channel=self.channel
            )
            # w = w_old - combined: computed from values identical on every rank, so the
            # weights stay bit-identical across ranks
            result = old.sub_(combined)
            with torch.no_grad():
                views = [v.view_as(p) for v, p in zip(torch.split(result, layout.sizes), params)]
                if all(p.dtype == torch.float32 for p in params):
                    torch._foreach_copy_(params, views)
                else:
                    for p, v in zip(params, views):
                        p.copy_(v)
                if bufs:
                    means = torch.split(buf_mean, [b.numel() for b in bufs])
                    if all(b.dtype == torch.float32 for b in bufs):
                        torch._foreach_copy_(bufs, [m.view_as(b) for m, b in zip(means, bufs)])
                    else:
                        for b, m in zip(bufs, means):
                            b.copy_(m.view_as(b))
        self.steps += 1

    def remove(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._old.clear()
        if self.channel is not None:
            self.channel.close()
            self.channel = None


