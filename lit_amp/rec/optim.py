"""``LazyAdam``: Adam over the rows a sparse gradient names (MindSpore's ``nn.LazyAdam``).

One optimizer for a recommender network: the embedding rows present in a sparse gradient get
Adam's update (so a step's cost does not grow with the table), dense gradients the ordinary
one. Big moments live on huge pages (:mod:`lit_amp.rec.huge_pages`), also after a resume.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from lit_amp._sparse import coalesced
from lit_amp.rec.huge_pages import MIN_BYTES, collapse, huge_zeros_like

__all__ = ["LazyAdam"]


def _moments_on_huge_pages(optimizer: torch.optim.Optimizer) -> None:
    """After ``load_state_dict``: move the moments (allocated by the loader) onto huge pages in
    place, or, where the kernel cannot (a memory-mapped file, an old kernel), copy them there.
    In place, a resume holds no second copy of gigabytes of moments."""
    for state in optimizer.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            t = state.get(key)
            if torch.is_tensor(t) and t.numel() * t.element_size() >= MIN_BYTES and \
                    not collapse(t):
                state[key] = huge_zeros_like(t).copy_(t)


class LazyAdam(torch.optim.Optimizer):
    """Adam that updates only the embedding rows present in a sparse gradient (MindSpore's
    ``nn.LazyAdam``); dense gradients get the ordinary Adam update.

    One optimizer for the whole Wide&Deep network (``Model``/``LitModel`` take one), instead of
    ``SparseAdam`` + ``Adam``.

    Args:
        params: parameters or parameter groups.
        lr: learning rate.
        betas: Adam's moment decays.
        eps: Adam's epsilon.

    Raises:
        ValueError: a negative lr/eps or a beta outside [0, 1).

    Example:
        >>> emb = torch.nn.Embedding(10, 2, sparse=True)
        >>> opt = LazyAdam(emb.parameters(), lr=0.1)
        >>> before = emb.weight.detach().clone()
        >>> emb(torch.tensor([1])).sum().backward(); opt.step()
        >>> torch.equal(emb.weight[0], before[0]), torch.equal(emb.weight[1], before[1])
        (True, False)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        if lr < 0 or eps < 0:
            raise ValueError(
                f"For 'LazyAdam', 'lr' and 'eps' must be >= 0, but got lr={lr}, eps={eps}."
            )
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"For 'LazyAdam', 'betas' must be in [0, 1), but got {betas}.")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps})
        self.register_load_state_dict_post_hook(_moments_on_huge_pages)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One update; returns ``closure()``'s loss when a closure is given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = huge_zeros_like(p)
                    state["exp_avg_sq"] = huge_zeros_like(p)
                state["step"] += 1
                t = state["step"]
                bc1, bc2 = 1 - b1**t, 1 - b2**t
                m, v = state["exp_avg"], state["exp_avg_sq"]
                g = p.grad
                if g.is_sparse:
                    g = coalesced(g)
                    idx, val = g.indices()[0], g.values()
                    m_rows = m.index_select(0, idx).mul_(b1).add_(val, alpha=1 - b1)
                    v_rows = v.index_select(0, idx).mul_(b2).addcmul_(val, val, value=1 - b2)
                    m.index_copy_(0, idx, m_rows)
                    v.index_copy_(0, idx, v_rows)
                    denom = v_rows.div_(bc2).sqrt_().add_(eps)
                    p.index_add_(0, idx, m_rows.div_(denom).mul_(-lr / bc1))
                else:
                    m.lerp_(g, 1 - b1)
                    v.mul_(b2).addcmul_(g, g, value=1 - b2)
                    denom = (v / bc2).sqrt_().add_(eps)
                    p.addcdiv_(m, denom, value=-lr / bc1)
        return loss
