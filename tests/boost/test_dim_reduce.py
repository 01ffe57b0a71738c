"""DimReduce: PCA projection, the quasi-Newton/line-search step by hand, PCA from checkpoints.

Training with AutoBoost + LitModel, resume and DDP: the boost contract (test_contract.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lit_amp.boost.dim_reduce import (
    DimReduceOptimizer,
    compute_pca_matrix,
    get_pca_matrix,
    load_weight_vectors,
)


def test_pca_projection_hand_example():
    # points on the line t * (3, 4) / 5 (+ a constant offset): one principal direction
    t = torch.tensor([[-2.0], [-1.0], [0.0], [1.0], [2.0]], dtype=torch.float64)
    w = t * torch.tensor([[0.6, 0.8]], dtype=torch.float64) + torch.tensor([[5.0, -1.0]])
    p = compute_pca_matrix(w, 1)
    assert p.shape == (1, 2)
    torch.testing.assert_close(p.abs(), torch.tensor([[0.6, 0.8]]))
    g = torch.tensor([1.0, 2.0])
    gk = p @ g  # projection onto the subspace
    torch.testing.assert_close(gk.abs(), torch.tensor([0.6 + 1.6]))
    torch.testing.assert_close(p.t() @ gk, torch.tensor([0.6, 0.8]) * 2.2)
    with pytest.raises(ValueError, match="fewer than n_components"):
        compute_pca_matrix(w, 6)


def test_first_step_by_hand():
    # L(w) = 0.5 |w|^2, P = I (2-D): gk = g = w, Bk = I -> dk = -w; r = 1 gives L = 0 < bound
    w = nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = DimReduceOptimizer(
        [w], torch.eye(2), alpha=0.1, gamma=0.9, loss_fn=lambda: 0.5 * (w**2).sum()
    )
    (0.5 * (w**2).sum()).backward()
    opt.step()
    assert opt.last_rho == 1.0
    # grad outside the subspace is 0 -> mom = 0; w_new = w - (0 - 1 * dn) = w + dk = 0
    torch.testing.assert_close(w.detach(), torch.zeros(2))
    torch.testing.assert_close(opt.sk, torch.tensor([-1.0, 2.0]))


def test_subspace_momentum_and_line_search_backtracks():
    # only the first coordinate is in the subspace; the second moves by alpha * momentum
    w = nn.Parameter(torch.tensor([4.0, 1.0]))
    p = torch.tensor([[1.0, 0.0]])

    def loss():
        return 10.0 * w[0] ** 2 + w[1] ** 2

    opt = DimReduceOptimizer([w], p, rho=0.5, alpha=0.01, sigma=0.4, loss_fn=loss)
    loss().backward()  # g = (80, 2)
    opt.step()
    # dk = -80: r = 1 -> w0 = -76 (worse), r = .5 -> -36 (worse), r = .25 -> -16 (worse):
    # no r passes, so r = rho^2 = .25 is used anyway (MindSpore) and sk keeps its old value
    assert opt.last_rho == 0.25
    torch.testing.assert_close(opt.sk, torch.zeros(1))
    torch.testing.assert_close(w.detach(), torch.tensor([4.0 - 0.25 * 80, 1.0 - 0.01 * 2]))


def test_no_loss_fn_is_an_error():
    w = nn.Parameter(torch.ones(2))
    opt = DimReduceOptimizer([w], torch.eye(2))
    w.sum().backward()
    with pytest.raises(RuntimeError, match="set_loss_fn"):
        opt.step()
    with pytest.raises(ValueError, match=r"'pca_mat' must have shape \[k, 2\]"):
        DimReduceOptimizer([w], torch.eye(3))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def test_pca_from_checkpoints(tmp_path):
    from lit_amp import save_checkpoint

    net = _net()
    for i in range(4):
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.1 * i)
        if i % 2:
            save_checkpoint(net, str(tmp_path / f"w{i}.ckpt"))  # lit_amp format
        else:  # a Lightning-style checkpoint of a LitModel
            sd = {f"network.{k}": v.clone() for k, v in net.state_dict().items()}
            torch.save({"state_dict": sd}, tmp_path / f"w{i}.ckpt")
    vecs = load_weight_vectors(tmp_path, net)
    n = sum(p.numel() for p in net.parameters())
    assert vecs.shape == (4, n)
    p = get_pca_matrix(net, n_components=2, weight_load_dir=tmp_path)
    assert p.shape == (2, n)
    assert (tmp_path / "pca_mat_temp.npy").exists()
    np.save(tmp_path / "given.npy", p.numpy())
    torch.testing.assert_close(get_pca_matrix(net, 2, pca_mat_path=tmp_path / "given.npy"), p)
    with pytest.raises(ValueError, match="weight_load_dir"):
        get_pca_matrix(net, 2)
