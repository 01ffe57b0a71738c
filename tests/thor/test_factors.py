"""THOR's layer statistics and preconditioning against explicit reference computations."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_amp.thor import factors as thor_factors
from lit_amp.thor.factors import (
    LayerFactors,
    apply_left,
    apply_right,
    conv_patches,
    invert_factors,
)
from lit_amp.thor.optimizer import THOR


def _one_step(net, x, y, *, damping=0.05, split_dim=128, lr=1.0):
    """One THOR step with plain updates (momentum 0): returns (grads before, deltas)."""
    opt = THOR(net, lr, damping, 0.0, frequency=2, factor_decay=0.0, split_dim=split_dim)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()
    grads = {n: p.grad.detach().clone() for n, p in net.named_parameters()}
    opt.step()
    delta = {n: (before[n] - p.detach()) / lr for n, p in net.named_parameters()}
    return opt, grads, delta


def _linear_reference(lin: nn.Linear, x: torch.Tensor, y: torch.Tensor, damping: float):
    """A, G and the Kronecker-preconditioned gradient computed densely in float64."""
    x64 = x.double()
    w, b = lin.weight.detach().double().requires_grad_(), lin.bias.detach().double()
    out = x64 @ w.t() + b
    out.retain_grad()
    F.cross_entropy(out, y).backward()
    n = x.shape[0]
    a = x64.t() @ x64 / n
    g = n * out.grad.t() @ out.grad
    return a, g, w.grad


def test_linear_matches_explicit_kronecker_inverse():
    torch.manual_seed(0)
    lin = nn.Linear(6, 5)
    x, y = torch.randn(32, 6), torch.randint(0, 5, (32,))
    lam = 0.05
    a, g, grad = _linear_reference(lin, x, y, lam)
    _, grads, delta = _one_step(lin, x, y, damping=lam)
    sq = math.sqrt(lam)
    ad = a + sq * torch.eye(6, dtype=torch.float64)
    gd = g + sq * torch.eye(5, dtype=torch.float64)
    # row-major vec: vec(G⁻¹ g A⁻¹) = (G ⊗ A)⁻¹ vec(g)
    expected = torch.linalg.solve(torch.kron(gd, ad), grad.reshape(-1)).reshape(5, 6)
    torch.testing.assert_close(grads["weight"].double(), grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(delta["weight"].double(), expected, rtol=2e-4, atol=1e-6)
    # the bias is not preconditioned (MindSpore): plain gradient
    torch.testing.assert_close(delta["bias"], grads["bias"], rtol=1e-5, atol=1e-7)


def test_pi_damping_splits_the_damping_between_the_factors():
    # K-FAC's factored Tikhonov damping (ASDL's default): √λ·π on A, √λ/π on G
    torch.manual_seed(0)
    lin = nn.Linear(6, 5)
    x, y = 3.0 * torch.randn(32, 6), torch.randint(0, 5, (32,))  # A ≫ G: π far from 1
    lam = 0.05
    a, g, grad = _linear_reference(lin, x, y, lam)
    opt = THOR(lin, 1.0, lam, 0.0, frequency=2, factor_decay=0.0, pi_damping=True)
    opt.zero_grad()
    F.cross_entropy(lin(x), y).backward()
    before = lin.weight.detach().clone()
    opt.step()
    delta = (before - lin.weight.detach()).double()
    pi = math.sqrt(float((a.trace() / 6) / (g.trace() / 5)))
    assert pi > 3
    sq = math.sqrt(lam)
    ad = a + sq * pi * torch.eye(6, dtype=torch.float64)
    gd = g + sq / pi * torch.eye(5, dtype=torch.float64)
    expected = torch.linalg.solve(gd, grad) @ torch.linalg.inv(ad)
    torch.testing.assert_close(delta, expected, rtol=2e-4, atol=1e-6)
    assert opt.layers[0].sqrt_damping == pytest.approx([sq * pi, sq / pi], rel=1e-5)
    # the plain rule would have moved the weight differently
    plain = torch.linalg.solve(g + sq * torch.eye(5, dtype=torch.float64), grad) @ torch.linalg.inv(
        a + sq * torch.eye(6, dtype=torch.float64))
    assert not torch.allclose(delta, plain, rtol=1e-2)


def test_bias_in_a_preconditions_weight_and_bias_jointly():
    # K-FAC's homogeneous coordinate: A over [x, 1], the update of [W | b] is G⁻¹ [gW | gb] A⁻¹
    torch.manual_seed(0)
    lin = nn.Linear(6, 5)
    x, y = torch.randn(32, 6) + 1.0, torch.randint(0, 5, (32,))
    lam = 0.05
    a, g, grad = _linear_reference(lin, x, y, lam)
    opt = THOR(lin, 1.0, lam, 0.0, frequency=2, factor_decay=0.0, bias_in_a=True)
    before = [p.detach().clone() for p in (lin.weight, lin.bias)]
    opt.zero_grad()
    F.cross_entropy(lin(x), y).backward()
    gb = lin.bias.grad.detach().double().clone()
    opt.step()
    dw, db = ((b - p.detach()).double() for b, p in zip(before, (lin.weight, lin.bias)))
    x1 = torch.cat([x.double(), torch.ones(32, 1, dtype=torch.float64)], 1)
    sq = math.sqrt(lam)
    ah = x1.t() @ x1 / 32 + sq * torch.eye(7, dtype=torch.float64)
    joint = torch.cat([grad, gb[:, None]], 1)
    expected = torch.linalg.solve(g + sq * torch.eye(5, dtype=torch.float64), joint) @ (
        torch.linalg.inv(ah))
    torch.testing.assert_close(dw, expected[:, :6], rtol=2e-4, atol=1e-6)
    torch.testing.assert_close(db, expected[:, 6], rtol=2e-4, atol=1e-6)
    assert not torch.allclose(db, gb, rtol=1e-2)  # the bias no longer takes the plain gradient


def _block_inverse(mat: torch.Tensor, sq: float, b: int) -> torch.Tensor:
    d = mat.shape[0]
    out = torch.zeros_like(mat)
    for s in range(0, d, b):
        e = min(s + b, d)
        blk = mat[s:e, s:e] + sq * torch.eye(e - s, dtype=mat.dtype)
        out[s:e, s:e] = torch.linalg.inv(blk)
    return out


@pytest.mark.parametrize("dense_max", [1024, 2])
def test_block_diagonal_inverse_when_split_dim_is_smaller(monkeypatch, dense_max):
    monkeypatch.setattr(thor_factors, "DENSE_APPLY_MAX", dense_max)  # 2: the (blocks,b,b) path
    torch.manual_seed(1)
    lin = nn.Linear(10, 7)
    x, y = torch.randn(40, 10), torch.randint(0, 7, (40,))
    lam = 0.1
    a, g, grad = _linear_reference(lin, x, y, lam)
    opt, _, delta = _one_step(lin, x, y, damping=lam, split_dim=4)
    sq = math.sqrt(lam)
    expected = _block_inverse(g, sq, 4) @ grad @ _block_inverse(a, sq, 4)
    torch.testing.assert_close(delta["weight"].double(), expected, rtol=2e-4, atol=1e-6)
    a_inv = opt.layers[0].A_inv
    assert a_inv.shape == ((10, 10) if dense_max > 10 else (3, 4, 4))
    # and it differs from the full inverse: the split is an approximation
    full = (
        torch.linalg.inv(g + sq * torch.eye(7, dtype=torch.float64))
        @ grad
        @ torch.linalg.inv(a + sq * torch.eye(10, dtype=torch.float64))
    )
    assert not torch.allclose(delta["weight"].double(), full, rtol=1e-3, atol=1e-5)


def test_apply_helpers_agree_with_dense_block_diag():
    torch.manual_seed(2)
    blocks = torch.randn(3, 4, 4)
    dense = torch.block_diag(*blocks)[:10, :10]
    g = torch.randn(10, 6)
    torch.testing.assert_close(apply_left(blocks, g), dense @ g)
    torch.testing.assert_close(apply_right(g.t(), blocks), g.t() @ dense)


def test_invert_factors_handles_singular_blocks():
    mat = torch.zeros(5, 5)  # singular, and no damping
    inv = invert_factors([mat], 0.0, 128)[0]
    assert torch.isfinite(inv).all()


def _conv_reference_patches(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Patches by explicit loops over output positions (no unfold)."""
    k, s, p, dil = conv.kernel_size[0], conv.stride[0], conv.padding[0], conv.dilation[0]
    xp = F.pad(x, (p, p))
    n, c, length = xp.shape
    out_len = (length - dil * (k - 1) - 1) // s + 1
    rows = []
    for b in range(n):
        for t in range(out_len):
            idx = [t * s + j * dil for j in range(k)]
            rows.append(xp[b, :, idx].reshape(-1))  # channel-major, kernel inner: weight order
    return torch.stack(rows)


@pytest.mark.parametrize(
    "conv",
    [
        nn.Conv1d(2, 3, 5, stride=2, padding=2),
        nn.Conv1d(3, 4, 3, stride=1, padding=1, dilation=2),
    ],
)
def test_conv1d_factors_against_explicit_patches(conv):
    torch.manual_seed(3)
    x = torch.randn(4, conv.in_channels, 11)
    lf = LayerFactors(conv, "conv")
    lf.install()
    out = conv(x)
    out.retain_grad()
    (out.pow(2).mean()).backward()
    a, g = lf.take_pending(grad_scale=1.0)
    patches = _conv_reference_patches(conv, x)
    torch.testing.assert_close(a, patches.t() @ patches / patches.shape[0], rtol=1e-5, atol=1e-6)
    d = out.grad.movedim(1, -1).reshape(-1, conv.out_channels)
    torch.testing.assert_close(g, 4 * d.t() @ d, rtol=1e-5, atol=1e-7)
    # the patch rows reproduce the convolution itself
    y = patches @ conv.weight.detach().reshape(conv.out_channels, -1).t() + conv.bias.detach()
    torch.testing.assert_close(y, out.detach().movedim(1, -1).reshape(-1, conv.out_channels))


def test_conv2d_factors_against_unfold_and_preconditioning():
    torch.manual_seed(4)
    conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
    x = torch.randn(5, 3, 8, 8)
    lam = 0.02
    # reference with F.unfold
    cols = F.unfold(x, 3, padding=1, stride=2)  # (N, C·9, L)
    rows = cols.transpose(1, 2).reshape(-1, 27).double()
    a_ref = rows.t() @ rows / rows.shape[0]
    out = conv(x)
    out.retain_grad()
    loss = out.pow(2).mean()
    loss.backward()
    d = out.grad.movedim(1, -1).reshape(-1, 4).double()
    g_ref = 5 * d.t() @ d
    grad = conv.weight.grad.double().reshape(4, -1)
    conv.zero_grad()
    opt = THOR(conv, 1.0, lam, 0.0, frequency=2, factor_decay=0.0)
    torch.testing.assert_close(conv_patches(conv, x).double(), rows)
    w0 = conv.weight.detach().clone()
    opt.zero_grad()
    conv(x).pow(2).mean().backward()
    opt.step()
    lf = opt.layers[0]
    torch.testing.assert_close(lf.A.double(), a_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lf.G.double(), g_ref, rtol=1e-5, atol=1e-7)
    sq = math.sqrt(lam)
    expected = torch.linalg.solve(
        torch.kron(
            g_ref + sq * torch.eye(4, dtype=torch.float64),
            a_ref + sq * torch.eye(27, dtype=torch.float64),
        ),
        grad.reshape(-1),
    ).reshape(4, 3, 3, 3)
    torch.testing.assert_close((w0 - conv.weight.detach()).double(), expected, rtol=5e-4, atol=1e-6)


def test_embedding_diagonal_a_and_full_g():
    torch.manual_seed(5)
    emb = nn.Embedding(7, 4)
    ids = torch.tensor([[0, 1, 1], [3, 1, 6]])
    lam = 0.04
    out = emb(ids)
    out.retain_grad()
    out.sum(-1).pow(2).mean().backward()
    grad = emb.weight.grad.clone()
    d = out.grad.reshape(-1, 4)
    emb.zero_grad()
    opt = THOR(emb, 1.0, lam, 0.0, frequency=2, factor_decay=0.0)
    w0 = emb.weight.detach().clone()
    emb(ids).sum(-1).pow(2).mean().backward()
    opt.step()
    lf = opt.layers[0]
    counts = torch.tensor([1.0, 3, 0, 1, 0, 0, 1]) / 6
    torch.testing.assert_close(lf.A, counts)
    torch.testing.assert_close(lf.G, 2 * d.t() @ d)
    sq = math.sqrt(lam)
    expected = (grad / (counts + sq)[:, None]) @ torch.linalg.inv(lf.G + sq * torch.eye(4))
    torch.testing.assert_close(w0 - emb.weight.detach(), expected, rtol=1e-4, atol=1e-6)


def test_statistics_are_fp32_under_bf16_compute():
    lin = nn.Linear(4, 3).to(torch.bfloat16)
    lf = LayerFactors(lin, "lin")
    lf.install()
    lin(torch.randn(8, 4, dtype=torch.bfloat16)).float().pow(2).mean().backward()
    a, g = lf.take_pending(1.0)
    assert a.dtype == g.dtype == torch.float32


def test_records_without_backward_or_in_eval_are_ignored():
    lin = nn.Linear(4, 3)
    lf = LayerFactors(lin, "lin")
    lf.install()
    with torch.no_grad():
        lin(torch.randn(2, 4))
    lin.eval()
    lin(torch.randn(2, 4))
    lin.train()
    lin(torch.randn(2, 4))  # forward with grad, but never backpropagated
    assert lf.take_pending(1.0) == (None, None)


def test_unsupported_module_raises_type_error():
    with pytest.raises(TypeError, match="'module'"):
        LayerFactors(nn.Conv2d(4, 4, 3, groups=2), "c")


def test_gradient_accumulation_gives_the_big_batch_factors():
    """20 micro-batches (more than the records kept before merging) == one batch of 20x."""
    torch.manual_seed(6)
    lin = nn.Linear(5, 4)
    x, y = torch.randn(80, 5), torch.randint(0, 4, (80,))
    big = LayerFactors(lin, "big")
    big.install()
    F.cross_entropy(lin(x), y).backward()
    a_big, g_big = big.take_pending(1.0)
    big.remove()
    acc = LayerFactors(lin, "acc")
    acc.install()
    for xs, ys in zip(x.chunk(20), y.chunk(20)):
        (F.cross_entropy(lin(xs), ys) / 20).backward()
    a_acc, g_acc = acc.take_pending(1.0)
    torch.testing.assert_close(a_acc, a_big)
    torch.testing.assert_close(g_acc, g_big)


def test_sequence_inputs_use_the_batch_dimension():
    torch.manual_seed(7)
    lin = nn.Linear(3, 2)
    x = torch.randn(4, 6, 3)  # (batch, time, features)
    lf = LayerFactors(lin, "seq")
    lf.install()
    out = lin(x)
    out.retain_grad()
    out.pow(2).mean().backward()
    a, g = lf.take_pending(1.0)
    rows = x.reshape(-1, 3)
    d = out.grad.reshape(-1, 2)
    torch.testing.assert_close(a, rows.t() @ rows / 24)
    torch.testing.assert_close(g, 4 * d.t() @ d)  # n = 4 examples, summed over time


def test_bias_in_a_for_conv_adds_the_ones_column_of_the_patches():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv1d(2, 3, 3, padding=1), nn.Flatten(), nn.Linear(3 * 8, 4))
    x, y = torch.randn(16, 2, 8), torch.randint(0, 4, (16,))
    opt = THOR(net, 0.1, 0.05, 0.0, frequency=2, factor_decay=0.0, bias_in_a=True)
    conv = opt.layers[0]
    assert conv.a_dim == 2 * 3 + 1 and conv.bias is net[0].bias
    F.cross_entropy(net(x), y).backward()
    gb = net[0].bias.grad.clone()
    before = net[0].bias.detach().clone()
    opt.step()
    patches = conv_patches(net[0], x)
    torch.testing.assert_close(conv.A[:-1, -1], patches.mean(0))  # E[patch] in the last column
    assert conv.A[-1, -1].item() == pytest.approx(1.0)
    assert not torch.allclose((before - net[0].bias.detach()) / 0.1, gb, rtol=1e-2)
