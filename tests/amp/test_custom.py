"""custom_mixed_precision (docs/semantics.md §2.3): white and black lists of classes and regexes."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from lit_amp.amp.convert import custom_mixed_precision
from lit_amp.amp.lists import get_black_list

F32, BF16 = torch.float32, torch.bfloat16


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.linear2 = nn.Linear(d, d)

    def forward(self, x):
        return self.linear2(torch.tanh(self.norm(self.linear1(x))))


class Encoder(nn.Module):
    def __init__(self, d: int = 8, n: int = 6) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(d) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.bn = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.bn(self.encoder(x)))


def weight_dtypes(net: nn.Module, x: torch.Tensor) -> dict[str, torch.dtype]:
    """name -> dtype of the weight each parametrised module computed with."""
    seen: dict[str, torch.dtype] = {}
    for name, m in net.named_modules():
        if isinstance(getattr(m, "weight", None), torch.Tensor):
            m.register_forward_pre_hook(
                lambda m, a, name=name: seen.__setitem__(name, m.weight.dtype)
            )
    out = net(x)
    assert out.dtype == F32
    out.sum().backward()
    assert all(p.grad is not None and p.grad.dtype == F32 for p in net.parameters())
    return seen


def test_white_list_by_class():
    net = custom_mixed_precision(Net(), white_list=[nn.LayerNorm], dtype=BF16)
    seen = weight_dtypes(net, torch.randn(4, 8))
    assert seen["encoder.layers.0.norm"] == BF16
    assert seen["encoder.layers.0.linear1"] == F32 and seen["head"] == F32 and seen["bn"] == F32


def test_white_list_by_regex_converts_whole_subtrees():
    net = custom_mixed_precision(Net(), white_list=[r"encoder\.layers\.[0-3]"], dtype=BF16)
    seen = weight_dtypes(net, torch.randn(4, 8))
    for i in range(4):
        for part in ("linear1", "norm", "linear2"):
            assert seen[f"encoder.layers.{i}.{part}"] == BF16
    for i in (4, 5):
        assert seen[f"encoder.layers.{i}.linear1"] == F32
    assert seen["head"] == F32 and seen["bn"] == F32


def test_white_list_regex_over_descendants_and_functions():
    net = custom_mixed_precision(
        Net(), white_list=[r"encoder\.layers\.[0-1]\..*", torch.tanh], dtype=BF16
    )
    seen = weight_dtypes(net, torch.randn(4, 8))
    assert seen["encoder.layers.1.norm"] == BF16 and seen["encoder.layers.2.norm"] == F32

    hits = []

    class T(nn.Module):
        def forward(self, x):
            y = torch.tanh(x)
            hits.append(torch.equal(y, torch.tanh(x.to(BF16)).float()))
            return y

    custom_mixed_precision(T(), white_list=[torch.tanh], dtype=BF16)(torch.randn(5) * 3)
    assert hits == [True]


def test_black_list_by_class_and_regex():
    with pytest.warns(UserWarning, match="removed from internal black list"):
        net = custom_mixed_precision(Net(), black_list=[nn.BatchNorm1d, r"head"], dtype=BF16)
    seen = weight_dtypes(net, torch.randn(4, 8))
    assert seen["bn"] == F32 and seen["head"] == F32
    assert seen["encoder.layers.3.norm"] == BF16  # LayerNorm removed from the black list
    assert seen["encoder.layers.3.linear1"] == BF16


def test_black_list_warns_for_each_removed_default():
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        custom_mixed_precision(Net(), black_list=[nn.LayerNorm], dtype=BF16)
    removed = sorted(str(w.message).split(", ")[1].split(" ")[0] for w in rec)
    assert removed == ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "GroupNorm", "SyncBatchNorm"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        custom_mixed_precision(Net(), black_list=get_black_list(), dtype=BF16)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({}, ValueError, "exactly one of 'white_list' and 'black_list'"),
        ({"white_list": [nn.Linear], "black_list": [nn.LayerNorm]}, ValueError, "exactly one"),
        ({"white_list": [nn.Linear], "dtype": torch.float32}, ValueError, "float16 or torch.bf"),
        ({"white_list": [3]}, TypeError, "each element of 'white_list'"),
        ({"white_list": [int]}, TypeError, "each element of 'white_list'"),
        ({"black_list": [torch.matmul]}, TypeError, "not supported in a black list"),
        ({"white_list": nn.Linear}, TypeError, "'white_list' must be a list"),
        ({"white_list": ["("]}, ValueError, "not a valid regular expression"),
    ],
)
def test_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        custom_mixed_precision(Net(), **kwargs)


def test_network_type_checked():
    with pytest.raises(TypeError, match="'network' must be a torch.nn.Module"):
        custom_mixed_precision(object(), white_list=[nn.Linear])


def test_repeated_conversion_warns():
    net = custom_mixed_precision(Net(), white_list=[nn.Linear], dtype=BF16)
    with pytest.warns(UserWarning, match="already been converted"):
        custom_mixed_precision(net, white_list=[nn.LayerNorm], dtype=BF16)
    seen = weight_dtypes(net, torch.randn(4, 8))
    assert seen["head"] == F32 and seen["encoder.layers.0.norm"] == BF16
