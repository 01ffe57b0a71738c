"""DimReduce: quasi-Newton steps, line search, in a PCA weight subspace (docs/semantics.md §3.3).

MindSpore's ``DimReduce`` (MS ``boost/dim_reduce.py``, ``boost/base.py``). With ``P`` the
``k x n`` PCA matrix of the flattened trainable weights (rows = principal directions), each
step, from the gradient ``g`` (averaged over ranks) and the loss ``L0``:

1. ``gk = P g``; quasi-Newton (BFGS on the inverse Hessian ``Bk``, init ``I``): if a previous
   ``gk`` exists, ``yk = gk - gk_last`` and, when ``yk·sk > 1e-20``, ``ρ = 1/(yk·sk)``,
   ``Bk = (I - ρ yk skᵀ)ᵀ Bk (I - ρ yk skᵀ) + ρ sk skᵀ``; then ``dk = -Bk gk``, ``dn = Pᵀ dk``.
2. Line search over ``r in (rho^0, rho^1, rho^2)``: the first ``r`` with
   ``L(w + r dn) < L0 + sigma r gkᵀdk`` is taken and sets ``sk = r dk``; if none passes,
   ``r = rho^2`` and ``sk`` keeps its old value (MindSpore's behaviour, kept).
3. ``mom = gamma mom + g - Pᵀgk`` (the gradient part outside the subspace, with momentum);
   ``w = w - (alpha mom - r dn)``.

MindSpore replaces the optimizer by ``SGD(lr=1)`` fed with these deltas; lit_amp's
:class:`DimReduceOptimizer` is a ``torch.optim.Optimizer`` doing the same. The line search
evaluates the loss on the current batch up to 3 more times (plus once for ``L0``), in train
mode, with BatchNorm running statistics restored afterwards.

The PCA matrix comes from ``pca_mat_path`` (a ``.npy`` of shape ``[k, n]``) or is computed from
the checkpoints in ``weight_load_dir`` (:func:`compute_pca_matrix`: centre, SVD, sign-fixed,
top ``n_components`` rows; saved there as ``pca_mat_temp.npy`` as MindSpore does). Files ending
in ``.ckpt`` are read: lit_amp checkpoints (``{"network": state_dict}``), Lightning checkpoints
(``{"state_dict": ...}``, a ``network.`` prefix is stripped) or plain state dicts. Under
``torch.distributed`` rank 0 computes it and broadcasts it (MindSpore writes per-rank files and
makes the other ranks poll for up to ``timeout`` seconds; lit_amp does not use ``timeout``).

Example:
    >>> w = torch.randn(6, 5)
    >>> P = compute_pca_matrix(w, 2)
    >>> P.shape, torch.allclose(P @ P.t(), torch.eye(2), atol=1e-5)
    (torch.Size([2, 5]), True)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from lit_amp._runtime import dist_ready, unwrap_optimizer
from lit_amp.boost.base import BoostAlgorithm, find_network

if TYPE_CHECKING:
    from lit_amp.boost.config import BoostConfig

__all__ = [
    "DimReduce",
    "DimReduceOptimizer",
    "compute_pca_matrix",
    "load_weight_vectors",
    "get_pca_matrix",
]

log = logging.getLogger(__name__)


def compute_pca_matrix(weights: Tensor | np.ndarray, n_components: int) -> Tensor:
    """The top ``n_components`` principal directions of ``weights`` rows (``[m, n]`` -> ``[k, n]``).

    Centres the rows, takes the SVD and fixes signs so that the largest ``|u|`` of each
    component is positive (MindSpore's ``_svd_flip``).

    Raises:
        ValueError: fewer samples than components.
    """
    data = torch.as_tensor(weights, dtype=torch.float64)
    if data.dim() != 2:
        raise ValueError(f"compute_pca_matrix: 'weights' must be 2-D, but got {tuple(data.shape)}.")
    if data.shape[0] < n_components:
        raise ValueError(
            f"compute_pca_matrix: {data.shape[0]} weight samples is fewer than n_components="
            f"{n_components}; save more checkpoints or lower n_components."
        )
    data = data - data.mean(0, keepdim=True)
    u, _, vh = torch.linalg.svd(data, full_matrices=False)
    idx = u.abs().argmax(0)
    signs = torch.sign(u[idx, torch.arange(u.shape[1])])
    signs[signs == 0] = 1
    vh = vh * signs[:, None]
    return vh[:n_components].float().contiguous()


def _state_dict_of(obj: Any) -> dict[str, Tensor]:
    if isinstance(obj, dict):
        if isinstance(obj.get("network"), dict):
            return obj["network"]
        if isinstance(obj.get("state_dict"), dict):
            return obj["state_dict"]
        return obj
    raise ValueError(f"unsupported checkpoint content {type(obj).__name__}")


def _load_weights_only(path: str) -> Any:
    """``torch.load(weights_only=True)``: a crafted file cannot run code while it is read."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle.UnpicklingError, a truncated zip, ...
        raise ValueError(
            f"DimReduce: checkpoint {path!r} in 'weight_load_dir' could not be read as tensors "
            f"and plain containers (torch.load weights_only=True: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}). Only weight files are read "
            "there; re-save it with lit_amp.save_checkpoint or torch.save(model.state_dict())."
        ) from exc


def load_weight_vectors(weight_load_dir: str | os.PathLike, network: nn.Module) -> Tensor:
    """Flattened trainable weights of ``network`` from every ``.ckpt`` file in a directory.

    Returns:
        ``[files, n]`` float32, the parameters in ``network.named_parameters()`` order.

    Raises:
        ValueError: not a directory, no ``.ckpt`` file, a file that is not a plain weights
            file (anything beyond tensors and containers is refused unread), or a file lacks
            a parameter.
    """
    d = os.fspath(weight_load_dir)
    if not os.path.isdir(d):
        raise ValueError(
            f"DimReduce: 'weight_load_dir' must be an existing directory, but got {d!r}."
        )
    files = sorted(f for f in os.listdir(d) if f.endswith(".ckpt"))
    if not files:
        raise ValueError(f"DimReduce: no '.ckpt' file in weight_load_dir {d!r}.")
    names = [n for n, p in network.named_parameters() if p.requires_grad]
    rows = []
    for f in files:
        sd = _state_dict_of(_load_weights_only(os.path.join(d, f)))
        vec = []
        for n in names:
            t = sd.get(n, sd.get(f"network.{n}"))
            if t is None:
                raise ValueError(
                    f"DimReduce: checkpoint {f!r} has no parameter {n!r} (nor 'network.{n}')."
                )
            vec.append(torch.as_tensor(t).detach().float().reshape(-1))
        rows.append(torch.cat(vec))
    return torch.stack(rows)


def get_pca_matrix(
    network: nn.Module,
    n_components: int = 32,
    pca_mat_path: str | os.PathLike | None = None,
    weight_load_dir: str | os.PathLike | None = None,
) -> Tensor:
    """Load (``pca_mat_path``, a ``.npy``) or compute (``weight_load_dir``) the PCA matrix.

    Under ``torch.distributed`` rank 0 loads/computes it and broadcasts it to all ranks.

    Raises:
        ValueError: neither source usable, or a shape that does not match the network.
    """
    n = sum(p.numel() for p in network.parameters() if p.requires_grad)
    distributed = dist_ready() and dist.get_world_size() > 1
    mat: Tensor | None = None
    if not distributed or dist.get_rank() == 0:
        path = os.fspath(pca_mat_path) if pca_mat_path is not None else None
        if path is not None and os.path.isfile(path) and path.endswith(".npy"):
            try:
                arr = np.load(path, allow_pickle=False)  # an object array would run code
            except ValueError as exc:
                raise ValueError(
                    f"DimReduce: 'pca_mat_path' {path!r} is not a plain numeric .npy array "
                    f"({exc}); save it with np.save(path, matrix.astype('float32'))."
                ) from exc
            mat = torch.as_tensor(arr, dtype=torch.float32)
        else:
            if weight_load_dir is None:
                raise ValueError(
                    "DimReduce needs a PCA matrix: set dim_reduce 'pca_mat_path' to an existing "
                    f".npy file (got {pca_mat_path!r}) or 'weight_load_dir' to a directory of "
                    ".ckpt files (got None)."
                )
            mat = compute_pca_matrix(load_weight_vectors(weight_load_dir, network), n_components)
            np.save(os.path.join(os.fspath(weight_load_dir), "pca_mat_temp.npy"), mat.numpy())
        mat = mat[:n_components]
    if distributed:
        shape = torch.tensor(list(mat.shape) if mat is not None else [0, 0])
        dist.broadcast(shape, 0)
        if mat is None:
            mat = torch.empty(int(shape[0]), int(shape[1]))
        dist.broadcast(mat, 0)
    assert mat is not None
    if mat.dim() != 2 or mat.shape[1] != n:
        raise ValueError(
            f"DimReduce: the PCA matrix has shape {tuple(mat.shape)}, but the network has {n} "
            "trainable weights (expected [n_components, n])."
        )
    return mat


class DimReduceOptimizer(torch.optim.Optimizer):
    """The DimReduce update as a torch optimizer (see the module docstring).

    Args:
        params: the trainable parameters, in the PCA matrix's column order.
        pca_mat: ``[k, n]`` PCA matrix.
        rho, gamma, alpha, sigma: MindSpore's defaults 0.55, 0.9, 0.001, 0.4.
        loss_fn: zero-argument callable returning the loss of the current batch at the current
            weights (no backward); settable later with :meth:`set_loss_fn`.

    Example:
        >>> w = nn.Parameter(torch.tensor([1.0, -2.0]))
        >>> opt = DimReduceOptimizer([w], torch.eye(2), loss_fn=lambda: (w ** 2).sum())
        >>> (w ** 2).sum().backward(); opt.step(); bool((w ** 2).sum() < 5.0)
        True
    """

    def __init__(
        self,
        params: Any,
        pca_mat: Tensor,
        rho: float = 0.55,
        gamma: float = 0.9,
        alpha: float = 0.001,
        sigma: float = 0.4,
        loss_fn: Callable[[], Tensor] | None = None,
        max_search_time: int = 3,
    ) -> None:
        super().__init__(params, {"rho": rho, "gamma": gamma, "alpha": alpha, "sigma": sigma})
        self._params = [p for g in self.param_groups for p in g["params"]]
        n = sum(p.numel() for p in self._params)
        pca = torch.as_tensor(pca_mat, dtype=torch.float32)
        if pca.dim() != 2 or pca.shape[1] != n:
            raise ValueError(
                f"DimReduceOptimizer: 'pca_mat' must have shape [k, {n}], but got "
                f"{tuple(pca.shape)}."
            )
        self.pca = pca.to(self._params[0].device)
        self.loss_fn = loss_fn
        self.max_search_time = max_search_time
        k = pca.shape[0]
        dev = self.pca.device
        self.bk = torch.eye(k, device=dev)
        self.sk = torch.zeros(k, device=dev)
        self.gk_last: Tensor | None = None
        self.mom = torch.zeros(n, device=dev)
        self.last_rho: float | None = None

    def set_loss_fn(self, loss_fn: Callable[[], Tensor] | None) -> None:
        """The loss of the current batch, evaluated by the line search."""
        self.loss_fn = loss_fn

    def _flat(self, attr: str) -> Tensor:
        out = []
        for p in self._params:
            t = p.grad if attr == "grad" else p
            out.append(
                torch.zeros(p.numel(), device=p.device)
                if t is None
                else t.detach().reshape(-1).float()
            )
        return torch.cat(out)

    def _assign(self, flat: Tensor) -> None:
        off = 0
        with torch.no_grad():
            for p in self._params:
                n = p.numel()
                p.copy_(flat[off : off + n].view_as(p).to(p.dtype))
                off += n

    def _loss(self) -> float:
        assert self.loss_fn is not None
        with torch.no_grad():
            v = self.loss_fn()
        v = torch.as_tensor(v, dtype=torch.float32).detach().reshape(()).clone()
        if dist_ready() and dist.get_world_size() > 1:
            dist.all_reduce(v)
            v /= dist.get_world_size()
        return float(v)

    def _quasi_newton(self, gk: Tensor) -> Tensor:
        if self.gk_last is not None:
            yk = gk - self.gk_last
            g = float(yk @ self.sk)
            if g > 1e-20:
                pk = 1.0 / g
                eye = torch.eye(len(gk), device=gk.device)
                t1 = eye - pk * torch.outer(yk, self.sk)
                self.bk = t1.t() @ self.bk @ t1 + pk * torch.outer(self.sk, self.sk)
        self.gk_last = gk.clone()
        return -(self.bk @ gk)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One DimReduce step; ``closure`` (if any) is called first, as torch optimizers do."""
        ret = None
        if closure is not None:
            with torch.enable_grad():
                ret = closure()
        if self.loss_fn is None:
            raise RuntimeError(
                "DimReduceOptimizer.step needs the batch loss for its line search: call "
                "set_loss_fn(fn) first (the DimReduce callback does it every batch)."
            )
        grp = self.param_groups[0]
        rho, gamma, alpha, sigma = grp["rho"], grp["gamma"], grp["alpha"], grp["sigma"]
        g = self._flat("grad")
        w_old = self._flat("param")
        old_loss = self._loss()
        gk = self.pca @ g
        dk = self._quasi_newton(gk)
        dn = self.pca.t() @ dk
        grad_proj = self.pca.t() @ gk
        gd = float(gk @ dk)
        r = rho ** (self.max_search_time - 1)
        for i in range(self.max_search_time):
            cand = rho**i
            self._assign(w_old + cand * dn)
            new_loss = self._loss()
            if old_loss + sigma * cand * gd > new_loss:
                self.sk = cand * dk
                r = cand
                break
        self.last_rho = r
        self.mom = gamma * self.mom + g - grad_proj
        delta = alpha * self.mom - r * dn
        self._assign(w_old - delta)
        return ret

    def subspace_state(self) -> dict[str, Any]:
        """The quasi-Newton and momentum state (``bk``, ``sk``, ``gk_last``, ``mom``)."""
        return {"bk": self.bk, "sk": self.sk, "gk_last": self.gk_last, "mom": self.mom}

    def load_subspace_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`subspace_state`."""
        dev = self.pca.device
        self.bk, self.sk, self.mom = (state[k].to(dev) for k in ("bk", "sk", "mom"))
        gk = state["gk_last"]
        self.gk_last = None if gk is None else gk.to(dev)

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["dim_reduce"] = self.subspace_state()
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        extra = state_dict.pop("dim_reduce", None)
        super().load_state_dict(state_dict)
        if extra is not None:
            self.load_subspace_state(extra)


def _bn_buffers(network: nn.Module) -> list[Tensor]:
    return [
        b
        for m in network.modules()
        if isinstance(m, nn.modules.batchnorm._NormBase)
        for b in m.buffers()
    ]


class DimReduce(BoostAlgorithm):
    """DimReduce as a Lightning callback: replaces the optimizer by :class:`DimReduceOptimizer`.

    Args:
        rho, gamma, alpha, sigma, n_components, pca_mat_path, weight_load_dir, timeout:
            MindSpore's ``dim_reduce`` settings (``timeout`` is accepted and unused).
        loss_fn: ``(pl_module, batch) -> loss`` for the line search; default
            ``pl_module.loss_of(batch)`` (``LitModel``). Required for other modules.

    Example:
        >>> cb = DimReduce(pca_mat_path="pca.npy")  # doctest: +SKIP
    """

    name = "dim_reduce"

    def __init__(
        self,
        rho: float = 0.55,
        gamma: float = 0.9,
        alpha: float = 0.001,
        sigma: float = 0.4,
        n_components: int = 32,
        pca_mat_path: str | os.PathLike | None = None,
        weight_load_dir: str | os.PathLike | None = None,
        timeout: int = 1800,
        loss_fn: Callable[[Any, Any], Tensor] | None = None,
    ) -> None:
        if pca_mat_path is None and weight_load_dir is None:
            raise ValueError(
                "DimReduce: set 'pca_mat_path' (a .npy PCA matrix) or 'weight_load_dir' (a "
                "directory of .ckpt files), both are None."
            )
        self.rho, self.gamma, self.alpha, self.sigma = rho, gamma, alpha, sigma
        self.n_components = n_components
        self.pca_mat_path = pca_mat_path
        self.weight_load_dir = weight_load_dir
        self.timeout = timeout
        self.loss_fn = loss_fn
        self.optimizer: DimReduceOptimizer | None = None
        self._pending: dict[str, Any] | None = None  # loaded before the optimizer exists
        self._pl_module: Any = None
        self._network: nn.Module | None = None

    @classmethod
    def from_boost_config(cls, config: BoostConfig) -> DimReduce:
        """``DimReduce(**section)``; ``enable_all`` without a PCA source is refused here.

        Raises:
            ValueError: mode ``enable_all`` and neither ``pca_mat_path`` nor
                ``weight_load_dir`` (MindSpore 2.10 accepts it at ``AutoBoost()`` and fails at
                the network build with "The weight_load_dir: None is None / not exists").
        """
        section = config.section(cls.name)
        if config.mode == "enable_all" and not (
            section.get("pca_mat_path") or section.get("weight_load_dir")
        ):
            raise ValueError(
                "boost_config_dict {'boost': {'mode': 'enable_all'}} turns on dim_reduce, which "
                "needs a PCA source: set boost_config_dict['dim_reduce']['pca_mat_path'] (a .npy "
                "matrix) or ['weight_load_dir'] (a directory of .ckpt files), or use mode "
                "'manual' with the features you want."
            )
        return cls(**section)

    def make_optimizer(self, network: nn.Module) -> DimReduceOptimizer:
        """Build the PCA matrix and the optimizer for ``network`` (pure torch)."""
        pca = get_pca_matrix(network, self.n_components, self.pca_mat_path, self.weight_load_dir)
        params = [p for p in network.parameters() if p.requires_grad]
        return DimReduceOptimizer(params, pca, self.rho, self.gamma, self.alpha, self.sigma)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        network = find_network(pl_module)
        if self.loss_fn is None and not hasattr(pl_module, "loss_of"):
            raise ValueError(
                f"DimReduce: {type(pl_module).__name__} has no 'loss_of(batch)'; pass "
                "DimReduce(loss_fn=lambda module, batch: ...) for the line search."
            )
        self.optimizer = self.make_optimizer(network)
        if self._pending is not None:
            self.optimizer.load_subspace_state(self._pending)
            self._pending = None
        old = [unwrap_optimizer(o) for o in trainer.optimizers]
        if trainer.lr_scheduler_configs:
            log.warning("DimReduce replaces the optimizer; its LR schedulers are dropped.")
            trainer.strategy.lr_scheduler_configs = []
        trainer.strategy.optimizers = [self.optimizer]
        self._pl_module = pl_module
        self._network = network
        log.info("DimReduce: replaced %s with DimReduceOptimizer.", [type(o).__name__ for o in old])

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.optimizer is None:
            return
        fn = self.loss_fn
        net = self._network
        buffers = _bn_buffers(net) if net is not None else []

        def loss() -> Tensor:
            saved = [b.clone() for b in buffers]
            try:
                return fn(pl_module, batch) if fn is not None else pl_module.loss_of(batch)
            finally:
                for b, s in zip(buffers, saved):
                    b.copy_(s)

        self.optimizer.set_loss_fn(loss)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.optimizer is not None:
            self.optimizer.set_loss_fn(None)

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's subspace state (empty before the first fit): a resumed run
        continues the same quasi-Newton steps."""
        if self.optimizer is not None:
            return dict(self.optimizer.subspace_state())
        return dict(self._pending or {})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self.optimizer is not None:
            self.optimizer.load_subspace_state(state_dict)
        else:
            self._pending = dict(state_dict)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.optimizer is not None:
            self.optimizer.set_loss_fn(None)
