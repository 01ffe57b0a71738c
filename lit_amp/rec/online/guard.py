"""The non-finite guard: a NaN / inf gradient never reaches the parameters of an online run.

One hostile batch (a value that overflows in the forward pass, a record that slipped past a
custom source's validation) makes the loss and the gradients NaN; one optimizer step with
them turns every parameter NaN, and every later publish serves NaN. :class:`NonFiniteGuard`
hooks the optimizer's ``step`` (``register_step_pre_hook``, so it covers Lightning's manual
and fast paths alike): when any gradient is non-finite, every gradient is dropped
(``grad = None``; torch's optimizers skip parameters without a gradient) and the step is
counted as skipped, as loss scaling skips an overflowing step. Under DDP the gradients are
already all-reduced, so every rank skips the same step.

:func:`first_nonfinite` / :func:`refuse_nonfinite` are the last line: checkpoints and published
weights are never written with a non-finite value in them.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from lit_amp._sparse import coalesced

__all__ = ["NonFiniteGuard", "all_finite", "first_nonfinite", "refuse_nonfinite"]

log = logging.getLogger(__name__)


#: elements checked at a time by :func:`all_finite` (``torch.isfinite`` of a float tensor makes
#: temporaries of about 1.75 x its size: on a whole 1.8 GB table, a 3 GB peak)
FINITE_CHUNK = 1 << 22


def all_finite(t: torch.Tensor) -> bool:
    """Whether ``t`` holds no NaN / inf, checked a chunk at a time (little extra memory).

    Example:
        >>> all_finite(torch.ones(10)), all_finite(torch.tensor([1.0, float("inf")]))
        (True, False)
    """
    if t.is_sparse:
        t = coalesced(t).values()
    if not t.is_floating_point() and not t.is_complex():
        return True
    if bool(_finite(t)):  # one reduction, no temporaries: 15-30 x faster than isfinite
        return True
    # the sum can overflow where no value is NaN / inf: the exact check decides
    if t.numel() <= FINITE_CHUNK or not t.is_contiguous():
        return bool(torch.isfinite(t).all())
    return all(bool(torch.isfinite(c).all()) for c in t.reshape(-1).split(FINITE_CHUNK))


def _finite(t: torch.Tensor) -> torch.Tensor:
    """A 0-d bool tensor: True only if every value of ``t`` is finite (a sum holding a NaN or
    an inf is NaN / inf); False also when the sum overflows (check exactly then)."""
    if t.is_sparse:
        t = coalesced(t).values()
    return torch.isfinite(t.sum())


def first_nonfinite(module: torch.nn.Module) -> str | None:
    """The name of the first floating-point parameter or buffer holding NaN / inf, or None.

    Example:
        >>> net = torch.nn.Linear(2, 1)
        >>> first_nonfinite(net) is None
        True
        >>> with torch.no_grad():
        ...     _ = net.bias.fill_(float("nan"))
        >>> first_nonfinite(net)
        'bias'
    """
    import itertools

    # named_parameters / named_buffers visit each tensor once, even in a module graph with
    # shared or cyclic references (state_dict() would recurse)
    for name, t in itertools.chain(module.named_parameters(), module.named_buffers()):
        if t.is_floating_point() and not all_finite(t.detach()):
            return name
    return None


def refuse_nonfinite(module: Any, what: str) -> None:
    """Raise a RuntimeError when ``module`` holds a NaN / inf: it must never be checkpointed or
    served (``what`` names the file in the message)."""
    if not isinstance(module, torch.nn.Module):
        return
    name = first_nonfinite(module)
    if name is not None:
        raise RuntimeError(
            f"online_train: {what} hold a non-finite value in {name!r}, so they are not "
            "written (serving or resuming them would spread NaN); the previous checkpoint and "
            "published weights are kept. Look for a non-finite input or a diverging "
            "learning rate; loss scaling or a lower learning rate may help."
        )


class NonFiniteGuard:
    """Drops an optimizer step whose gradients hold NaN / inf (see the module docstring).

    Args:
        optimizers: the torch optimizers to guard.

    Example:
        >>> net = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
        >>> guard = NonFiniteGuard([opt])
        >>> net(torch.tensor([[float("inf"), 1.0]])).sum().backward()
        >>> w = net.weight.detach().clone()
        >>> opt.step()
        >>> torch.equal(w, net.weight), guard.skipped
        (True, 1)
        >>> guard.remove()
    """

    def __init__(self, optimizers: list[Any]) -> None:
        self.skipped = 0
        self._handles = [
            opt.register_step_pre_hook(self._pre_step)
            for opt in optimizers
            if callable(getattr(opt, "register_step_pre_hook", None))
        ]

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if not params:
            return
        for p in params:  # coalesced once, here: the optimizer's own coalesce is then free
            if p.grad.is_sparse and not p.grad.is_coalesced():
                p.grad = coalesced(p.grad)
        flags = [_finite(p.grad) for p in params]
        try:
            ok = bool(torch.stack(flags).all())  # one device sync
        except RuntimeError:  # parameters on several devices
            ok = all(bool(f) for f in flags)
        if ok or all(all_finite(p.grad) for p in params):  # else: NaN / inf, or an overflow
            return
        for p in params:
            p.grad = None
        self.skipped += 1
        if self.skipped <= 10 or self.skipped % 1000 == 0:
            log.warning(
                "online_train: a gradient holds NaN or inf; the optimizer step is skipped "
                "(%d skipped so far) so that the parameters stay finite.",
                self.skipped,
            )

    def remove(self) -> None:
        """Unhook the optimizers."""
        for h in self._handles:
            h.remove()
        self._handles = []
