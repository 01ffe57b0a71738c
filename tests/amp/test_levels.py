"""resolve_amp_config / apply_amp_config: the level table, device defaults and ``auto``."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch import nn

from lit_amp.amp import levels as amp_config
from lit_amp.amp.convert import apply_amp_config, auto_mixed_precision
from lit_amp.amp.levels import (
    UNSET,
    AmpConfig,
    cpu_has_native_bf16,
    default_amp_dtype,
    resolve_amp_config,
    validate_amp_level,
)
from lit_amp.amp.loss_scale.managers import DynamicLossScaleManager, FixedLossScaleManager

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


@pytest.fixture
def no_native_bf16(monkeypatch):
    monkeypatch.setattr(amp_config, "cpu_has_native_bf16", lambda: False)


@pytest.fixture
def native_bf16(monkeypatch):
    monkeypatch.setattr(amp_config, "cpu_has_native_bf16", lambda: True)


def test_default_dtype_by_device():
    assert default_amp_dtype("cpu") == BF16
    assert default_amp_dtype("cuda") == F16
    assert default_amp_dtype(torch.device("cuda", 1)) == F16
    assert resolve_amp_config("O3", device="cpu").dtype == BF16
    assert resolve_amp_config("O3", device="cuda").dtype == F16


def test_o2_default_manager_depends_on_dtype():
    cfg = resolve_amp_config("O2", device="cuda")
    assert isinstance(cfg.loss_scale_manager, DynamicLossScaleManager)
    assert cfg.loss_scale_manager.get_loss_scale() == 2.0**24
    assert resolve_amp_config("O2", device="cuda", dtype=BF16).loss_scale_manager is None
    assert resolve_amp_config("O2", device="cpu").loss_scale_manager is None
    for level in ("O0", "O1", "O3"):
        assert resolve_amp_config(level, device="cuda").loss_scale_manager is None
    # each resolution gets its own manager (MindSpore shares one instance: a known quirk)
    assert (resolve_amp_config("O2", device="cuda").loss_scale_manager
            is not resolve_amp_config("O2", device="cuda").loss_scale_manager)


def test_explicit_manager_and_none_override():
    m = FixedLossScaleManager(64.0)
    assert resolve_amp_config("O0", device="cpu", loss_scale_manager=m).loss_scale_manager is m
    cfg = resolve_amp_config("O2", device="cuda", loss_scale_manager=None)
    assert cfg.loss_scale_manager is None
    assert resolve_amp_config("O2", device="cuda", loss_scale_manager=UNSET).loss_scale_manager


def test_config_fields_and_frozen():
    cfg = resolve_amp_config("O2", device="cpu")
    assert isinstance(cfg, AmpConfig)
    assert (cfg.level, cfg.dtype, cfg.keep_batchnorm_fp32, cfg.cast_model_type) == (
        "O2", BF16, True, BF16)
    assert cfg.loss_in_fp32 and cfg.output_fp32
    o1 = resolve_amp_config("O1", device="cpu")
    assert o1.loss_in_fp32 and not o1.output_fp32 and o1.cast_model_type == F32
    o0 = resolve_amp_config("O0", device="cpu")
    assert not o0.loss_in_fp32 and not o0.output_fp32 and o0.mechanism == "none"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.level = "O3"


@pytest.mark.parametrize(
    "level, kwargs, mechanism",
    [
        ("O2", {"keep_batchnorm_fp32": False}, "O3"),
        ("O2", {"cast_model_type": F32}, "none"),
        ("O2", {"cast_model_type": F32, "keep_batchnorm_fp32": False}, "O3"),
        ("O3", {"keep_batchnorm_fp32": True}, "O2"),
        ("O3", {"cast_model_type": F32}, "none"),
        ("O1", {"cast_model_type": BF16}, "O3"),
        ("O0", {"cast_model_type": BF16, "keep_batchnorm_fp32": True}, "O2"),
        ("O1", {"keep_batchnorm_fp32": True}, "O1"),
    ],
)
def test_mindspore_precision_pass(level, kwargs, mechanism):
    assert resolve_amp_config(level, device="cpu", **kwargs).mechanism == mechanism


def test_cast_model_type_sets_dtype_and_conflicts():
    assert resolve_amp_config("O2", device="cuda", cast_model_type=BF16).dtype == BF16
    with pytest.raises(ValueError, match="conflict"):
        resolve_amp_config("O2", device="cpu", dtype=BF16, cast_model_type=F16)


def test_auto_on_cpu_with_native_bf16(native_bf16):
    cfg = resolve_amp_config("auto", device="cpu")
    assert (cfg.level, cfg.dtype, cfg.loss_scale_manager, cfg.requested_level) == (
        "O2", BF16, None, "auto")


def test_auto_on_cpu_without_native_bf16(no_native_bf16):
    with pytest.warns(UserWarning, match="falling back to 'O0'"):
        cfg = resolve_amp_config("auto", device="cpu")
    assert cfg.level == "O0" and cfg.mechanism == "none"


@pytest.mark.parametrize("bf16_ok, dtype, dynamic", [(True, BF16, False), (False, F16, True)])
def test_auto_on_cuda(monkeypatch, bf16_ok, dtype, dynamic):
    monkeypatch.setattr(amp_config, "_cuda_bf16_supported", lambda: bf16_ok)
    cfg = resolve_amp_config("auto", device="cuda")
    assert cfg.level == "O2" and cfg.dtype == dtype
    assert isinstance(cfg.loss_scale_manager, DynamicLossScaleManager) == dynamic


def test_cpu_bf16_detection_reads_cpuinfo(monkeypatch):
    monkeypatch.setattr(amp_config, "_cpu_flags", lambda: frozenset({"sse", "avx512_bf16"}))
    assert cpu_has_native_bf16()
    monkeypatch.setattr(amp_config, "_cpu_flags", lambda: frozenset({"sse", "amx_bf16"}))
    assert cpu_has_native_bf16()
    monkeypatch.setattr(amp_config, "_cpu_flags", lambda: frozenset({"sse", "avx2"}))
    assert not cpu_has_native_bf16()


def test_fp16_on_cpu_warns():
    with pytest.warns(UserWarning, match="orders of magnitude slower"):
        resolve_amp_config("O2", device="cpu", dtype=F16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve_amp_config("O0", device="cpu", dtype=F16)  # nothing computes in fp16
        resolve_amp_config("O2", device="cuda", dtype=F16)


def test_lists_apply_only_to_their_mechanism():
    with pytest.warns(UserWarning, match="white_list is used only by the O1"):
        resolve_amp_config("O2", device="cpu", white_list=[nn.Linear])
    with pytest.warns(UserWarning, match="black_list is used only by the O2"):
        resolve_amp_config("O1", device="cpu", black_list=[nn.Linear])


def test_apply_amp_config_in_place_and_lists():
    net = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    cfg = resolve_amp_config("O2", device="cpu", black_list=[nn.LayerNorm, r"2"])
    assert apply_amp_config(net, cfg) is net
    seen = {}
    for i, m in enumerate(net):
        m.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, m.weight.dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert net(torch.randn(2, 4)).dtype == F32
    assert seen == {0: BF16, 1: F32, 2: F32}


def test_apply_o0_leaves_network_untouched():
    net = nn.Linear(2, 2)
    apply_amp_config(net, resolve_amp_config("O0", device="cpu"))
    assert not net._forward_pre_hooks and not hasattr(net, "_amp_level")


def test_auto_mixed_precision_auto_level(native_bf16):
    net = auto_mixed_precision(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), "auto")
    assert net._amp_level == "O2" and net._amp_dtype == BF16


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: validate_amp_level("o2"), ValueError, "must be one of"),
        (lambda: validate_amp_level(None), TypeError, "must be a str"),
        (lambda: resolve_amp_config("O2", device="cpu", dtype=torch.float64), ValueError,
         "'dtype' must be torch.float16"),
        (lambda: resolve_amp_config("O2", device="cpu", keep_batchnorm_fp32="yes"), TypeError,
         "'keep_batchnorm_fp32' must be a bool"),
        (lambda: resolve_amp_config("O2", device="cpu", cast_model_type=torch.int8), ValueError,
         "'cast_model_type' must be"),
        (lambda: resolve_amp_config("O2", device="cpu", loss_scale_manager="dynamic"), TypeError,
         "'loss_scale_manager' must be None"),
        (lambda: apply_amp_config("net", resolve_amp_config("O2", device="cpu")), TypeError,
         "'network' must be a torch.nn.Module"),
    ],
)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
