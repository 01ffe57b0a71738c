"""ASDL's K-FAC (``asdfghjkl==0.1a5``, ``asdl.KfacGradientMaker``) as the K-FAC anchor of
``bench/thor.py`` (issue #20).

ASDL imports ``torch.cuda.nvtx`` and wraps its phases in ``nvtx.range``; on a CPU-only torch
that context manager raises, so :func:`_nvtx_stand_in` replaces it by a no-op before ASDL is
imported (the only change made to the library; documented in docs/benchmarks.md).

:class:`AsdlKfac` drives one training step the way ASDL documents it::

    maker.setup_model_call(net, x); maker.setup_loss_call(F.cross_entropy, y_dummy, y)
    maker.forward_and_backward()   # curvature / inverse updates on their cadence, preconditions
    optimizer.step()               # SGD-momentum (+ weight decay after preconditioning)
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _nvtx_stand_in() -> None:
    """No-op ``torch.cuda.nvtx.range`` (context manager and decorator) on CPU-only torch."""
    if torch.cuda.is_available():
        return
    import torch.cuda.nvtx as nvtx

    class _Range(contextlib.ContextDecorator):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __enter__(self) -> _Range:
            return self

        def __exit__(self, *exc: Any) -> bool:
            return False

    nvtx.range = _Range
    nvtx.range_push = lambda *a, **k: 0
    nvtx.range_pop = lambda *a, **k: 0


_nvtx_stand_in()
import asdl  # noqa: E402

#: ASDL cadences compared: K-FAC's usual one (factors every step, EMA, inverse every 10) and
#: THOR's (factors and inverse every 10 steps, empirical Fisher: one backward per step).
CADENCES: dict[str, dict[str, Any]] = {
    "default": {"curvature_upd_interval": 1, "preconditioner_upd_interval": 10,
                "ema_decay": 0.05, "fisher_type": "fisher_mc"},
    "every10": {"curvature_upd_interval": 10, "preconditioner_upd_interval": 10,
                "ema_decay": 0.5, "fisher_type": "fisher_emp"},
}


class _Unsqueeze2(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(2)


class _Squeeze2(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(2)


def conv1d_as_conv2d(net: nn.Module) -> nn.Module:
    """Replace every ``nn.Conv1d`` of ``net`` (in place) by the same map as a 1×k ``nn.Conv2d``.

    ASDL 0.1a5's K-FAC supports Linear and Conv2d only (a Conv1d layer is skipped with a
    warning, i.e. left unpreconditioned), so the CNN1D rows run the identical network with each
    Conv1d rewritten as ``unsqueeze(2) → Conv2d(1×k, same weights) → squeeze(2)``.
    """
    for name, child in list(net.named_children()):
        if isinstance(child, nn.Conv1d):
            if child.padding_mode != "zeros" or isinstance(child.padding, str):
                raise ValueError(f"conv1d_as_conv2d: unsupported padding of {name!r}")
            conv = nn.Conv2d(child.in_channels, child.out_channels, (1, child.kernel_size[0]),
                             stride=(1, child.stride[0]), padding=(0, child.padding[0]),
                             dilation=(1, child.dilation[0]), groups=child.groups,
                             bias=child.bias is not None)
            with torch.no_grad():
                conv.weight.copy_(child.weight.unsqueeze(2))
                if child.bias is not None:
                    conv.bias.copy_(child.bias)
            setattr(net, name, nn.Sequential(_Unsqueeze2(), conv, _Squeeze2()))
        else:
            conv1d_as_conv2d(child)
    return net


class AsdlKfac:
    """An ASDL K-FAC gradient maker plus SGD-momentum, with THOR's lr schedule hook.

    Args:
        net: the network (Linear / Conv2d layers preconditioned, bias in A as ASDL does);
            its Conv1d layers are rewritten in place by :func:`conv1d_as_conv2d`.
        lr: initial learning rate of the SGD-momentum step.
        damping: ASDL's damping λ (π-corrected √λ split between A and G).
        weight_decay: SGD's L2 coefficient (added after preconditioning, as in THOR).
        cadence: a key of :data:`CADENCES`.
        data_size: the batch size (ASDL averages the curvature over it).
    """

    def __init__(self, net: nn.Module, lr: float, damping: float, weight_decay: float,
                 cadence: str = "default", data_size: int = 100) -> None:
        c = dict(CADENCES[cadence])
        fisher_type = c.pop("fisher_type")
        cfg = asdl.PreconditioningConfig(damping=damping, data_size=data_size, **c)
        self.net = conv1d_as_conv2d(net)
        self.maker = asdl.KfacGradientMaker(net, cfg, fisher_type=fisher_type)
        self.opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9,
                                   weight_decay=weight_decay)
        self.param_groups = self.opt.param_groups
        self.cfg = cfg
        self.inversions = 0

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One step: ASDL forward/backward (+ curvature, inverse, preconditioning), SGD."""
        step = self.maker.state["step"]
        if self.maker.do_update_preconditioner(step):
            self.inversions += 2 * len(list(self.maker.modules_for_curvature))
        self.opt.zero_grad(set_to_none=True)
        dummy = self.maker.setup_model_call(self.net, x)
        self.maker.setup_loss_call(F.cross_entropy, dummy, y)
        _, loss = self.maker.forward_and_backward()
        self.opt.step()
        return loss
