"""Layer statistics for THOR: Kronecker factors, their hooks and block-diagonal inverses.

Pure PyTorch. One :class:`LayerFactors` per preconditioned layer (``nn.Linear``, ``nn.Conv1d``,
``nn.Conv2d``, ``nn.Embedding``) records, while its hooks are installed (second-order steps
only), the statistics of the layer's input (A) and of the gradient w.r.t. its output (G), in
float32 whatever the compute dtype, and inverts them in diagonal blocks. Statistics of a call
whose backward never ran or that are not finite (a step the loss scaler skipped) are dropped,
so skipped steps never corrupt the factors. How each layer type's factors are normalised is in
docs/differences.md, "THOR".

Example:
    >>> import torch
    >>> from torch import nn
    >>> lin = nn.Linear(4, 3)
    >>> lf = LayerFactors(lin, "lin")
    >>> lf.install()
    >>> lin(torch.randn(8, 4)).pow(2).mean().backward()
    >>> a, g = lf.take_pending(grad_scale=1.0)
    >>> a.shape, g.shape
    (torch.Size([4, 4]), torch.Size([3, 3]))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_amp._validation import type_error

__all__ = [
    "LayerFactors",
    "SUPPORTED_LAYERS",
    "is_supported_layer",
    "invert_factors",
    "apply_left",
    "apply_right",
    "DENSE_APPLY_MAX",
]

#: Layer types THOR preconditions with Kronecker factors (others get plain momentum SGD).
SUPPORTED_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding)

#: Inverses of factors up to this dimension are stored as one dense (block-diagonal) matrix, so
#: a first-order step costs two plain matmuls; larger ones keep their (blocks, b, b) form.
DENSE_APPLY_MAX = 1024

_MAX_RECORDS = 16  # per-layer forward calls kept between two optimizer steps before merging


def is_supported_layer(module: nn.Module) -> bool:
    """Whether THOR can precondition ``module``'s weight with Kronecker factors.

    Linear, Conv1d and Conv2d (``groups == 1``) and dense-gradient Embedding layers whose
    weight requires grad.

    Example:
        >>> is_supported_layer(nn.Linear(2, 2)), is_supported_layer(nn.BatchNorm1d(2))
        (True, False)
    """
    if not isinstance(module, SUPPORTED_LAYERS):
        return False
    weight = getattr(module, "weight", None)
    if not isinstance(weight, Tensor) or not weight.requires_grad:
        return False
    if isinstance(module, (nn.Conv1d, nn.Conv2d)) and module.groups != 1:
        return False
    if isinstance(module, nn.Embedding) and module.sparse:
        return False
    return True


class _Record:
    """Statistics of one forward call (A part) and of its backward (G part)."""

    __slots__ = ("a", "rows", "n", "g", "need_g")

    def __init__(self, a: Tensor | None, rows: int, n: int, need_g: bool) -> None:
        self.a = a
        self.rows = rows
        self.n = n  # the batch dimension of the call
        self.g: Tensor | None = None
        self.need_g = need_g

    @property
    def done(self) -> bool:
        return self.g is not None or not self.need_g


class LayerFactors:
    """Kronecker factors, inverses and statistics hooks of one layer.

    Args:
        module: an ``nn.Linear``, ``nn.Conv1d``, ``nn.Conv2d`` (groups 1) or ``nn.Embedding``.
        name: the layer's qualified name (for messages and checkpoints).
        index: the layer's position among the optimizer's preconditioned layers.

    Attributes:
        A, G: the running factors (float32; ``A`` is a vector for Embedding), or None.
        A_inv, G_inv: the damped inverses in use: a (d, d) matrix (block-diagonal when the
            dimension exceeds ``split_dim``), a (blocks, b, b) stack for dimensions above
            :data:`DENSE_APPLY_MAX`, a vector for Embedding's A; None before the first refresh.
        trace_ref: the damped traces of A and G when they were last inverted.
        frozen: per factor, whether the trace rule stopped refreshing it for good.

    Raises:
        TypeError: ``module`` is not a supported layer.
    """

    def __init__(self, module: nn.Module, name: str = "", index: int = 0,
                 bias_in_a: bool = False) -> None:
        if not is_supported_layer(module):
            raise type_error(
                "LayerFactors", "module", "a Linear, Conv1d/Conv2d (groups=1) or dense Embedding "
                "layer whose weight requires grad", module
            )
        self.module = module
        self.name = name
        self.index = index
        self.weight: Tensor = module.weight
        if isinstance(module, nn.Linear):
            self.kind = "linear"
            self.a_dim, self.g_dim = module.in_features, module.out_features
        elif isinstance(module, nn.Embedding):
            self.kind = "embedding"
            self.a_dim, self.g_dim = module.num_embeddings, module.embedding_dim
        else:
            self.kind = "conv"
            conv: Any = module
            self.a_dim = conv.in_channels * math.prod(conv.kernel_size)
            self.g_dim = conv.out_channels
        bias = getattr(module, "bias", None)
        #: the bias is preconditioned with the weight (a ones column in A, as K-FAC does)
        self.bias: Tensor | None = (
            bias if bias_in_a and self.kind != "embedding" and isinstance(bias, Tensor)
            and bias.requires_grad else None
        )
        self.a_dim += self.bias is not None
        self.A: Tensor | None = None
        self.G: Tensor | None = None
        self.A_inv: Tensor | None = None
        self.G_inv: Tensor | None = None
        self.trace_ref: list[float | None] = [None, None]
        self.frozen: list[bool] = [False, False]
        #: the damping added to A and G at the last refresh (√λ, or √λ·π and √λ/π)
        self.sqrt_damping: list[float] = [0.0, 0.0]
        self._records: list[_Record] = []
        self._handle: Any = None
        # A⁻¹ and its weight / bias columns as contiguous copies (``precondition_with_bias``)
        self._a_split: tuple[Tensor, Tensor, Tensor] | None = None

    # ------------------------------------------------------------------ hooks
    @property
    def installed(self) -> bool:
        """Whether the statistics hook is registered on the module."""
        return self._handle is not None

    @property
    def ready(self) -> bool:
        """Whether both inverses exist (the layer is preconditioned)."""
        return self.A_inv is not None and self.G_inv is not None

    def install(self) -> None:
        """Register the forward hook that records statistics (idempotent)."""
        if self._handle is None:
            self._handle = self.module.register_forward_hook(self._forward_hook)

    def remove(self) -> None:
        """Remove the hook and drop statistics not yet consumed."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._records.clear()

    def _forward_hook(self, module: nn.Module, inputs: tuple, output: Any) -> None:
        if not module.training or not torch.is_grad_enabled():
            return
        if not isinstance(output, Tensor) or not output.requires_grad or not inputs:
            return
        x = inputs[0]
        if not isinstance(x, Tensor):
            return
        with torch.no_grad():
            a, rows = (None, 0) if self.frozen[0] else self._a_stat(x.detach())
        rec = _Record(a, rows, self._batch_dim(x), not self.frozen[1])
        records = self._records
        if len(records) >= _MAX_RECORDS:
            self._merge_oldest()
        records.append(rec)
        if rec.need_g:
            output.register_hook(lambda grad, rec=rec: self._grad_hook(grad, rec))

    def _batch_dim(self, x: Tensor) -> int:
        """The batch size of a call (1 for an unbatched input)."""
        if self.kind == "conv":
            batched = x.dim() == (3 if isinstance(self.module, nn.Conv1d) else 4)
        else:
            batched = x.dim() >= (2 if self.kind == "linear" else 1)
        return x.shape[0] if batched else 1

    def _grad_hook(self, grad: Tensor, rec: _Record) -> None:
        with torch.no_grad():
            d = grad.detach()
            if self.kind == "conv":  # channels first, (C, N·L): a copy of contiguous runs
                d = (d if d.dim() > 2 else d.unsqueeze(0)).transpose(0, 1)
                d = d.reshape(self.g_dim, -1).float()
                g = d @ d.t()
            else:
                d = d.reshape(-1, self.g_dim).float()
                g = d.t() @ d
            rec.g = g if rec.g is None else rec.g + g  # the gradient may arrive in pieces
        return None

    def _merge_oldest(self) -> None:
        r0, r1 = self._records[0], self._records[1]
        if not (r0.done and r1.done):
            self._records.pop(0 if not r0.done else 1)  # a forward without backward
            return
        a = None if r0.a is None or r1.a is None else r0.a + r1.a
        merged = _Record(a, r0.rows + r1.rows, r0.n + r1.n, r0.need_g)
        merged.g = None if r0.g is None or r1.g is None else r0.g + r1.g
        self._records[0:2] = [merged]

    # ------------------------------------------------------------ statistics
    def _a_stat(self, x: Tensor) -> tuple[Tensor, int]:
        """(sum of input outer products — a vector of id counts for Embedding, rows)."""
        if self.kind == "embedding":
            ids = x.reshape(-1)
            return torch.bincount(ids, minlength=self.a_dim).float(), ids.numel()
        if self.kind == "linear":
            rows = x.reshape(-1, self.a_dim - (self.bias is not None)).float()
            if self.bias is not None:
                rows = torch.cat([rows, rows.new_ones(rows.shape[0], 1)], 1)
        else:
            rows = _patch_rows(self.module, x, self.bias is not None)
        return rows.t() @ rows, rows.shape[0]

    def take_pending(self, grad_scale: float = 1.0) -> tuple[Tensor | None, Tensor | None]:
        """Consume the recorded statistics: ``(A_batch, G_batch)`` (None where nothing valid).

        Drops calls whose backward did not run and, when several calls were recorded, those
        with non-finite statistics (an overflowing step the loss scaler skipped). A single
        call's statistics are returned as they are (the optimizer checks all layers with one
        host sync and ignores non-finite ones).

        Args:
            grad_scale: the loss scale the backward passes ran with (G is divided by its
                square).
        """
        records = [r for r in self._records if r.done]
        self._records.clear()
        if len(records) > 1:  # several calls (a skipped overflow step, accumulation): check each
            flags = torch.stack(
                [
                    torch.stack(
                        [torch.isfinite(t).all() for t in (r.a, r.g) if t is not None]
                    ).all()
                    for r in records
                ]
            ).tolist()
            records = [r for r, ok in zip(records, flags) if ok]
        if not records:
            return None, None
        a = g = None
        if not self.frozen[0]:
            rows = sum(r.rows for r in records)
            a_sum = records[0].a
            for r in records[1:]:
                a_sum = a_sum + r.a
            a = a_sum / rows if rows else None
        if not self.frozen[1]:
            n = sum(r.n for r in records)
            g_sum = records[0].g
            for r in records[1:]:
                g_sum = g_sum + r.g
            g = g_sum * (n / (grad_scale * grad_scale))
        return a, g

    # -------------------------------------------------------------- applying
    def precondition_with_bias(self, grad: Tensor, bias_grad: Tensor | None
                               ) -> tuple[Tensor, Tensor]:
        """``G⁻¹ · [g | b] · A⁻¹`` for a layer whose A carries the bias column (``bias``).

        Both results are contiguous (strided slices of one joint result made every later
        elementwise op of the update slower), computed from A⁻¹'s weight and bias columns kept
        as contiguous copies until A⁻¹ changes.
        """
        out_dim = grad.shape[0]
        b = grad.new_zeros(out_dim) if bias_grad is None else bias_grad
        g2 = grad if grad.dim() == 2 else grad.reshape(out_dim, -1)
        joint = torch.cat([g2, b.unsqueeze(1) if b.dim() == 1 else b.reshape(out_dim, 1)], 1)
        a_inv, g_inv = self.A_inv, self.G_inv
        assert a_inv is not None and g_inv is not None
        if a_inv.dim() == 2 and g_inv.dim() == 2:  # dense inverses: A⁻¹'s columns pre-split
            split = self._a_split
            if split is None or split[0] is not a_inv:
                split = self._a_split = (a_inv, a_inv[:, :-1].contiguous(),
                                         a_inv[:, -1].contiguous())
            left = torch.mm(g_inv, joint if joint.dtype == torch.float32 else joint.float())
            w, bo = torch.mm(left, split[1]), torch.mv(left, split[2])
        else:
            out = self._apply(joint)
            w, bo = out[:, :-1].contiguous(), out[:, -1].contiguous()
        if grad.dim() != 2:
            w = w.view(grad.shape)
        if b.dim() != 1:
            bo = bo.view(b.shape)
        return (w, bo) if grad.dtype == torch.float32 else (w.to(grad.dtype), bo.to(b.dtype))

    def precondition(self, grad: Tensor) -> Tensor:
        """``G⁻¹ · g · A⁻¹`` (Embedding: ``diag(A⁻¹) · g · G⁻¹``) in the gradient's shape."""
        out = self._apply(grad.reshape(grad.shape[0], -1)).view(grad.shape)
        return out if grad.dtype == torch.float32 else out.to(grad.dtype)

    def _apply(self, g2: Tensor) -> Tensor:
        """The float32 preconditioned (out, in) matrix of a 2-D gradient."""
        a_inv, g_inv = self.A_inv, self.G_inv
        assert a_inv is not None and g_inv is not None
        g = g2 if g2.dtype == torch.float32 else g2.float()
        if self.kind == "embedding":
            return apply_right(g * a_inv.unsqueeze(1), g_inv)
        if a_inv.dim() == 2 and g_inv.dim() == 2:  # dense inverses: two plain matmuls
            return torch.mm(torch.mm(g_inv, g), a_inv)
        return apply_right(apply_left(g_inv, g), a_inv)

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Factors, inverses, trace references and frozen flags (for checkpoints)."""
        return {
            "name": self.name,
            "A": self.A,
            "G": self.G,
            "A_inv": self.A_inv,
            "G_inv": self.G_inv,
            "trace_ref": list(self.trace_ref),
            "frozen": list(self.frozen),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`; tensors move to the weight's device."""
        dev = self.weight.device

        def to(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device=dev, dtype=torch.float32)

        self.A, self.G = to(state["A"]), to(state["G"])
        self.A_inv, self.G_inv = to(state["A_inv"]), to(state["G_inv"])
        self.trace_ref = list(state.get("trace_ref", [None, None]))
        self.frozen = [bool(f) for f in state.get("frozen", [False, False])]
        self._records.clear()

    def __repr__(self) -> str:
        return (
            f"LayerFactors({self.name or type(self.module).__name__}, kind={self.kind}, "
            f"A={self.a_dim}, G={self.g_dim}, ready={self.ready})"
        )


def conv_patches(module: nn.Module, x: Tensor) -> Tensor:
    """im2col patches of a Conv1d/Conv2d input as (N·L, Cin·k) rows, in the weight's order.

    Applies the layer's own padding (any ``padding`` / ``padding_mode``), stride and dilation.
    The rows are gathered from strided views of the input (``Tensor.unfold``) in one copy:
    the same values as ``F.unfold``, whose CPU kernel loops over the batch one sample at a
    time and cost THOR's CNN most of its refresh.

    Example:
        >>> conv = nn.Conv1d(2, 3, 3, padding=1)
        >>> conv_patches(conv, torch.randn(4, 2, 10)).shape
        torch.Size([40, 6])
        >>> x = torch.randn(4, 2, 10)
        >>> ref = F.unfold(F.pad(x, (1, 1)).unsqueeze(2), (1, 3)).transpose(1, 2).reshape(40, 6)
        >>> torch.equal(conv_patches(conv, x), ref)
        True
    """
    return _patch_rows(module, x, False)


def _patch_view(module: nn.Module, x: Tensor) -> Tensor:
    """The patches as a strided view (N, *out_spatial, Cin, *kernel) of the padded input."""
    conv: Any = module
    one_d = isinstance(module, nn.Conv1d)
    spatial = 1 if one_d else 2
    if x.dim() == spatial + 1:  # unbatched input
        x = x.unsqueeze(0)
    pads = list(conv._reversed_padding_repeated_twice)
    if any(pads):
        mode = "constant" if conv.padding_mode == "zeros" else conv.padding_mode
        x = F.pad(x, pads, mode=mode)
    v = x
    for i in range(spatial):  # (N, C, *out_spatial, *span)
        k, d = conv.kernel_size[i], conv.dilation[i]
        v = v.unfold(2 + i, d * (k - 1) + 1, conv.stride[i])
    if any(d != 1 for d in conv.dilation):
        v = v[(..., *(slice(None, None, d) for d in conv.dilation))]
    # (N, C, O..., K...) -> (N, O..., C, K...)
    order = [0, *range(2, 2 + spatial), 1, *range(2 + spatial, 2 + 2 * spatial)]
    return v.permute(order)


def _patch_rows(module: nn.Module, x: Tensor, ones: bool) -> Tensor:
    """Float32 patch rows (N·L, Cin·k), with a trailing ones column when ``ones``."""
    v = _patch_view(module, x)
    d = math.prod(v.shape[(v.dim() - 2) // 2 + 1:])  # Cin · kernel
    m = v.numel() // d
    if not ones:
        return v.reshape(m, d).float()
    return _with_ones(v, m)


def _with_ones(v: Tensor, m: int) -> Tensor:
    """``[rows | 1]`` as float32, ``rows`` being the patch view ``v`` read as (m, -1), in one
    copy (for a Linear input ``torch.cat`` is cheaper)."""
    d = v.numel() // m
    out = torch.empty(m, d + 1, dtype=torch.float32, device=v.device)
    out[:, d] = 1.0
    out[:, :d].view(v.shape).copy_(v)
    return out


# --------------------------------------------------------------------------- inverses
def _blocks(mat: Tensor, sqrt_damping: float, split_dim: int | None) -> tuple[Tensor, int]:
    """Damped diagonal blocks (nb, b, b) of ``mat`` padded with identity, and the dim d."""
    d = mat.shape[0]
    damped = mat.clone()  # + √λ·I: the diagonal only (the same values, no identity matrix)
    damped.diagonal().add_(sqrt_damping)
    if split_dim is None or d <= split_dim:
        return damped.unsqueeze(0), d
    b = split_dim
    nb = -(-d // b)
    padded = torch.eye(nb * b, device=mat.device, dtype=mat.dtype)
    padded[:d, :d] = damped
    idx = torch.arange(nb, device=mat.device)
    blocks = padded.view(nb, b, nb, b)[idx, :, idx, :]
    return blocks, d


def invert_factors(
    mats: Sequence[Tensor], sqrt_damping: float | Sequence[float], split_dim: int | None
) -> list[Tensor]:
    """Invert ``mat + sqrt_damping·I`` for each matrix, block-diagonally, by Cholesky in fp32.

    ``sqrt_damping`` is one value for all matrices or one per matrix (π-corrected damping).

    Each matrix larger than ``split_dim`` is cut into ``split_dim``-sized diagonal blocks (the
    last one padded with identity, as MindSpore does) whose inverses form a block-diagonal
    approximation of the true inverse; ``split_dim=None`` inverts whole matrices. Blocks of the
    same size (from all matrices) are inverted in one batched call; blocks are never padded to a
    common size (a 76-wide block padded to 128 would cost ~5x the flops). A block that is
    not positive definite in fp32 is retried with growing jitter.

    Returns:
        Per matrix, a (d, d) inverse when ``d <= DENSE_APPLY_MAX`` (block-diagonal when split),
        else a (blocks, b, b) stack for :func:`apply_left` / :func:`apply_right`.

    Example:
        >>> m = torch.eye(3) * 3.0
        >>> invert_factors([m], 1.0, 128)[0].diagonal()
        tensor([0.2500, 0.2500, 0.2500])
    """
    if not mats:
        return []
    damps = ([float(sqrt_damping)] * len(mats) if isinstance(sqrt_damping, (int, float))
             else [float(v) for v in sqrt_damping])
    per_mat: list[tuple[Tensor, int]] = [
        _blocks(m.float(), sd, split_dim) for m, sd in zip(mats, damps)
    ]
    buckets: dict[int, list[tuple[int, int]]] = {}  # block size -> [(matrix, block index)]
    for i, (blocks, _) in enumerate(per_mat):
        for j in range(blocks.shape[0]):
            buckets.setdefault(blocks.shape[-1], []).append((i, j))
    inv_blocks: list[list[Tensor | None]] = [[None] * bl.shape[0] for bl, _ in per_mat]
    for members in buckets.values():
        if len(members) == 1:
            i, j = members[0]
            batch = per_mat[i][0][j: j + 1]
        else:
            batch = torch.stack([per_mat[i][0][j] for i, j in members])
        inv = _cholesky_inverse(batch)
        for k, (i, j) in enumerate(members):
            inv_blocks[i][j] = inv[k]
    out: list[Tensor] = []
    for (_, d), invs in zip(per_mat, inv_blocks):
        if len(invs) == 1:
            out.append(invs[0])
        elif d <= DENSE_APPLY_MAX:
            out.append(torch.block_diag(*invs)[:d, :d].contiguous())
        else:
            out.append(torch.stack(invs).contiguous())
    return out


def _cholesky_inverse(batch: Tensor) -> Tensor:
    chol, info = torch.linalg.cholesky_ex(batch)
    bad = info != 0
    if bool(bad.any()):
        eye = torch.eye(batch.shape[-1], device=batch.device, dtype=batch.dtype)
        scale = batch.diagonal(dim1=-2, dim2=-1).abs().mean(-1).clamp_min(1e-12)
        jitter = 1e-6
        while bool(bad.any()) and jitter <= 1e2:
            fixed = batch[bad] + (jitter * scale[bad])[:, None, None] * eye
            c, inf = torch.linalg.cholesky_ex(fixed)
            chol[bad] = c
            still = torch.zeros_like(bad)
            still[bad] = inf != 0
            bad = still
            jitter *= 10
        if bool(bad.any()):
            chol[bad] = eye  # give up on these blocks: identity (plain gradient)
    return torch.cholesky_inverse(chol)


def apply_left(inv: Tensor, g: Tensor) -> Tensor:
    """``inv @ g`` for a dense inverse or a (blocks, b, b) block-diagonal stack.

    Example:
        >>> apply_left(torch.eye(2) * 2, torch.ones(2, 3)).sum().item()
        12.0
    """
    if inv.dim() == 2:
        return inv @ g
    nb, b, _ = inv.shape
    d = g.shape[0]
    pad = nb * b - d
    gp = F.pad(g, (0, 0, 0, pad)) if pad else g
    return torch.bmm(inv, gp.reshape(nb, b, -1)).reshape(nb * b, -1)[:d]


def apply_right(g: Tensor, inv: Tensor) -> Tensor:
    """``g @ inv`` for a dense inverse or a (blocks, b, b) block-diagonal stack.

    Example:
        >>> apply_right(torch.ones(3, 2), torch.eye(2) * 2).sum().item()
        12.0
    """
    if inv.dim() == 2:
        return g @ inv
    nb, b, _ = inv.shape
    m, d = g.shape
    pad = nb * b - d
    gp = F.pad(g, (0, pad)) if pad else g
    out = torch.bmm(gp.reshape(m, nb, b).transpose(0, 1), inv)  # (nb, m, b)
    return out.transpose(0, 1).reshape(m, nb * b)[:, :d]
