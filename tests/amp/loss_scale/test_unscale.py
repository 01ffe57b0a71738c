"""The controller's gradient pass: fused unscale-and-check, declared loss scales, one flag."""

from __future__ import annotations

import torch

from lit_amp.amp.loss_scale.unscale import (
    FactorCache,
    any_overflow,
    declared_loss_scale,
    local_shard,
    unscale_and_check_,
)


def test_declared_loss_scale_reads_group_then_attribute_then_defaults():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    group = opt.param_groups[0]
    assert declared_loss_scale(opt, group) == 1.0
    opt.defaults["loss_scale"] = 8
    assert declared_loss_scale(opt, group) == 8.0
    opt.loss_scale = torch.tensor(16.0)
    assert declared_loss_scale(opt, group) == 16.0
    group["loss_scale"] = 32.0
    assert declared_loss_scale(opt, group) == 32.0
    group["loss_scale"] = True  # a bool is not a scale
    assert declared_loss_scale(opt, group) == 1.0


def test_unscale_and_check_scales_in_place_and_flags_non_finite_per_device():
    grads = [torch.tensor([2.0, 4.0]), torch.tensor([6.0], dtype=torch.float64)]
    flags = unscale_and_check_(grads, 0.5, FactorCache())
    assert grads[0].tolist() == [1.0, 2.0] and grads[1].tolist() == [3.0]
    assert len(flags) == 1 and float(flags[0]) == 0.0
    bad = [torch.tensor([1.0, float("nan")])]
    assert float(unscale_and_check_(bad, 1.0, FactorCache())[0]) == 1.0


def test_unscale_and_check_handles_sparse_gradients():
    sparse = torch.sparse_coo_tensor([[0, 2]], [4.0, float("inf")], (3,))
    flags = unscale_and_check_([sparse], 0.25, FactorCache())
    assert float(flags[0]) == 1.0
    assert sparse.coalesce().values()[0].item() == 1.0


def test_factor_cache_reuses_and_bounds_its_tensors():
    cache = FactorCache(limit=2)
    cpu = torch.device("cpu")
    first = cache.get(cpu, 0.5)
    assert cache.get(cpu, 0.5) is first and first.dtype == torch.float32
    for f in (1.0, 2.0, 3.0, 4.0):
        cache.get(cpu, f)
    assert len(cache._tensors) <= 3


def test_any_overflow_without_distributed():
    assert any_overflow([]) is False
    assert any_overflow([torch.zeros(1)]) is False
    assert any_overflow([torch.zeros(1), torch.ones(1)]) is True


def test_local_shard_passes_plain_tensors_through():
    t = torch.ones(2)
    assert local_shard(t) is t
