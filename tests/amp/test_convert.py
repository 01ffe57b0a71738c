"""The conversion (``lit_amp.amp.convert``): with auto_mixed_precision, which layer computes in
which dtype at O0-O3, for float16 and bfloat16.

Observed through forward hooks: a pre-hook registered after the conversion sees the inputs and
the parameters the layer computes with; a forward hook registered with ``prepend=True`` sees the
layer's raw output (before lit_amp casts it).
"""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_amp.amp import casting as mp
from lit_amp.amp.convert import (
    auto_mixed_precision,
    get_amp_level,
    remove_mixed_precision,
)
from lit_amp.amp.diagnostics import CastCounter

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


class Mix(nn.Module):
    """A custom layer: functional matmul (white-listed op) and GELU (not white-listed)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(d, d) / d**0.5)
        self.last: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.matmul(x, self.w)
        self.last = {"x": x.detach(), "y": y.detach()}
        return F.gelu(y)


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm1d(4)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(4 * 8, 16)
        self.ln = nn.LayerNorm(16)
        self.mix = Mix(16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.bn(self.conv(x.unsqueeze(1)))).flatten(1)
        return self.head(self.mix(self.ln(self.fc(h))))


LAYERS = ("conv", "bn", "relu", "fc", "ln", "mix", "head")


def observe(net: nn.Module) -> dict[str, dict[str, torch.dtype | None]]:
    """Per layer of LAYERS, the dtypes its class's forward computes with: its input and weight as
    the forward receives them (after any cast a conversion makes around it) and its output."""
    rec: dict[str, dict[str, torch.dtype | None]] = {}
    for name in LAYERS:
        m = getattr(net, name)
        cls = type(m)

        def forward(self, *args, _cls=cls, _name=name, **kwargs):
            w = getattr(self, "weight", None)
            if w is None:
                w = getattr(self, "w", None)
            r = rec[_name] = {"in": args[0].dtype, "w": w.dtype if torch.is_tensor(w) else None}
            out = _cls.forward(self, *args, **kwargs)
            r["out"] = out.dtype
            return out

        m.__class__ = type(cls.__name__, (cls,), {"forward": forward})
    return rec


def expected(level: str, low: torch.dtype) -> dict[str, torch.dtype]:
    if level == "O0":
        return dict.fromkeys(LAYERS, F32)
    if level == "O1":
        # torch.autocast: convolutions and matmuls compute in the low dtype and hand it on; the
        # layers after them take it as it is (the CPU's norms return their input's dtype)
        return dict.fromkeys(LAYERS, low)
    if level == "O2":
        d = dict.fromkeys(LAYERS, low)
        d.update(ln=F32)  # BatchNorm takes the low activation (its kernel computes in float32)
        return d
    return dict.fromkeys(LAYERS, low)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_layer_dtypes_storage_output_loss_grads(level, dtype):
    net = SmallNet()
    ref = {k: v.clone() for k, v in net.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fp16 on CPU warns (tested elsewhere)
        assert auto_mixed_precision(net, level, dtype) is net
    rec = observe(net)
    x, y = torch.randn(6, 8), torch.randint(0, 3, (6,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = net(x)
    exp = expected(level, dtype)
    weights = {**exp, "bn": F32} if level == "O2" else exp  # float32 weights and statistics
    if level == "O1":
        weights = dict.fromkeys(LAYERS, F32)  # autocast casts the weights inside the op
    for name in LAYERS:
        r = rec[name]
        # at O1 the network's float32 input reaches the first layer as it is (autocast casts it
        # inside the convolution)
        assert r["in"] == (F32 if level == "O1" and name == "conv" else exp[name]), (name, r)
        assert r["out"] == exp[name], (name, r)
        if r["w"] is not None:
            assert r["w"] == weights[name], (name, r)
    # the network output is float32 at every level; the loss too
    assert out.dtype == F32
    loss = nn.CrossEntropyLoss()(out, y)
    assert loss.dtype == F32
    loss.backward()
    # parameters stay stored in fp32, and the gradients reach them in fp32
    for n, p in net.named_parameters():
        assert p.dtype == F32 and type(p) is nn.Parameter, n
        assert p.grad is not None and p.grad.dtype == F32, n
        assert torch.isfinite(p.grad).all(), n
    # buffers keep their dtype; BatchNorm's running stats were updated
    for n, b in net.named_buffers():
        assert b.dtype == ref[n].dtype, n
    assert not torch.equal(net.bn.running_mean, ref["bn.running_mean"])
    assert get_amp_level(net) == (None if level == "O0" else level)


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_functional_ops_follow_the_level(level):
    """A torch.matmul inside a custom module: low at O1 (autocast's op list), O2 and O3."""
    net = SmallNet()
    auto_mixed_precision(net, level, BF16)
    net(torch.randn(4, 8))
    x, y = net.mix.last["x"], net.mix.last["y"]
    assert y.dtype == BF16
    low = (x.to(BF16) @ net.mix.w.detach().to(BF16)).to(y.dtype)
    assert torch.equal(y, low)


def test_o2_keeps_outputs_of_black_list_low_and_root_fp32():
    net = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    auto_mixed_precision(net, "O2", BF16)
    seen = []
    net[2].register_forward_pre_hook(lambda m, a: seen.append(a[0].dtype))
    net[1].register_forward_hook(lambda m, a, o: seen.append(o.dtype))  # after lit_amp's cast
    assert net(torch.randn(3, 4)).dtype == F32
    assert seen == [BF16, BF16]


def test_o3_batchnorm_low_and_running_stats_fp32():
    net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6))
    auto_mixed_precision(net, "O3", BF16)
    for _ in range(3):
        net(torch.randn(16, 4) + 3)
    assert net[1].running_mean.dtype == F32 and net[1].running_mean.abs().sum() > 0
    assert int(net[1].num_batches_tracked) == 3
    net.eval()
    rm = net[1].running_mean.clone()
    with torch.inference_mode():
        assert net(torch.randn(2, 4)).dtype == F32
    assert torch.equal(rm, net[1].running_mean)


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("train", [True, False])
def test_o2_batchnorm_takes_the_low_activation_without_a_cast(dtype, train):
    """MindSpore's float32 BatchNorm at O2 (an island: float32 weights and statistics, output
    low) computes without casting the activation to float32 and back: the kernel accumulates
    in float32 from the low input, so the output, the input gradient and the statistics equal
    those of the island computed in float32."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv1d(3, 8, 3), nn.BatchNorm1d(8), nn.ReLU(), nn.Conv1d(8, 4, 3))
    ref[1].weight.data.uniform_(0.5, 1.5)
    net, bare = copy.deepcopy(ref), nn.Sequential(copy.deepcopy(ref[0]), nn.ReLU(),
                                                   copy.deepcopy(ref[3]))
    for m in (net, bare):
        auto_mixed_precision(m, "O2", dtype)
        m.train(train)
    seen = []
    net[1].register_forward_pre_hook(lambda m, a: seen.append(a[0].dtype))
    x = torch.randn(16, 3, 12)
    for m in (net, bare):  # the weight casts of the first step are cached
        m(x)
    with CastCounter() as with_bn:
        y = net(x.requires_grad_())
    with CastCounter() as without_bn:
        bare(x)
    assert seen[-1] == dtype and y.dtype == F32
    assert net[1].weight.dtype == F32 and net[1].running_mean.dtype == F32
    assert with_bn.count == without_bn.count  # the island adds no cast
    # the same numbers as the float32 island (the activation cast up and the output back)
    ref.train(train)
    low = lambda t: t.to(dtype)  # noqa: E731
    for _ in range(2):  # as many forwards as the converted network ran
        h = low(F.conv1d(low(x), low(ref[0].weight), low(ref[0].bias)))
        h = low(ref[1](h.float()))
        out = F.conv1d(low(F.relu(h)), low(ref[3].weight), low(ref[3].bias)).float()
    assert torch.equal(y, out)
    assert torch.equal(net[1].running_mean, ref[1].running_mean)
    torch.testing.assert_close(net[1].running_var, ref[1].running_var, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_loss_module_inside_the_network_computes_in_fp32(level):
    from lit_amp.amp.cells import WithLossCell

    seen = []
    loss_fn = nn.CrossEntropyLoss()
    cell = WithLossCell(nn.Sequential(nn.Linear(4, 3)), loss_fn)
    auto_mixed_precision(cell, level, BF16)
    loss_fn.register_forward_hook(lambda m, a, out: seen.append((a[0], out)))
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    loss = cell(x, y)
    logits, out = seen[0]
    assert logits.dtype == (F32 if level == "O1" else BF16)  # the network's output, as passed
    # the loss computed in float32: exactly the float32 loss of those logits
    assert loss.dtype == out.dtype == F32
    assert torch.equal(loss, nn.functional.cross_entropy(logits.float(), y))


def test_o0_is_a_no_op():
    net = SmallNet()
    assert auto_mixed_precision(net, "O0") is net
    assert not any(m._forward_pre_hooks for m in net.modules())


def test_second_call_warns_and_replaces():
    net = SmallNet()
    auto_mixed_precision(net, "O3", BF16)
    with pytest.warns(UserWarning, match="already been converted"):
        auto_mixed_precision(net, "O2", BF16)
    fresh = auto_mixed_precision(SmallNet(), "O2", BF16)

    def installed(n: nn.Module) -> list:
        # what a conversion put on each module: a forward, hooks
        return [("forward" in m.__dict__, len(m._forward_pre_hooks), len(m._forward_hooks))
                for m in n.modules()]

    assert installed(net) == installed(fresh)  # the O3 conversion left nothing behind
    rec = observe(net)
    net(torch.randn(2, 8))
    assert rec["bn"]["w"] == F32 and rec["fc"]["w"] == BF16


def test_remove_restores_fp32():
    net = auto_mixed_precision(SmallNet(), "O3", BF16)
    remove_mixed_precision(net)
    rec = observe(net)
    net(torch.randn(2, 8))
    assert all(r["out"] == F32 for r in rec.values())
    assert get_amp_level(net) is None


@pytest.mark.parametrize(
    "args, exc, match",
    [
        (("not a module", "O2"), TypeError, "'network' must be a torch.nn.Module"),
        ((nn.Linear(2, 2), "O4"), ValueError, "must be one of 'O0', 'O1', 'O2', 'O3', 'auto'"),
        ((nn.Linear(2, 2), 2), TypeError, "must be a str"),
        ((nn.Linear(2, 2), "O2", torch.float32), ValueError, "float16 or torch.bfloat16"),
        ((nn.Linear(2, 2), "O2", "bf16"), ValueError, "but got 'bf16'"),
    ],
)
def test_errors(args, exc, match):
    with pytest.raises(exc, match=match):
        auto_mixed_precision(*args)


def test_fp16_on_cpu_warns_once():
    net = auto_mixed_precision(nn.Linear(4, 4), "O2", F16)
    with pytest.warns(UserWarning, match="orders of magnitude slower"):
        net(torch.randn(2, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        net(torch.randn(2, 4))


def test_exception_in_forward_restores_parameters():
    class Boom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            self.lin(x)
            raise RuntimeError("boom")

    net = auto_mixed_precision(Boom(), "O2", BF16)
    with pytest.raises(RuntimeError, match="boom"):
        net(torch.randn(1, 2))
    assert type(net.lin.weight) is nn.Parameter and net.lin.weight.dtype == F32


def test_deepcopy_and_pickle_keep_working(monkeypatch):
    monkeypatch.setattr(mp, "CACHE_MIN_NUMEL", 0)
    net = auto_mixed_precision(SmallNet(), "O2", BF16)
    net(torch.randn(2, 8))
    for clone in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        rec = observe(clone)
        out = clone(torch.randn(2, 8))
        assert out.dtype == F32 and rec["fc"]["w"] == BF16 and rec["bn"]["w"] == F32
        out.sum().backward()
        assert clone.fc.weight.grad is not None and net.fc.weight.grad is None


def test_containers_rnn_attention_kwargs():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.LSTM(4, 8, batch_first=True)
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
            self.register_buffer("scale", torch.tensor(0.5))

        def forward(self, x, *, mask=None):
            h, _ = self.rnn(x)
            a, _ = self.attn(h, h, h, need_weights=False)
            return {"out": a * self.scale, "pair": (h, a)}

    for level in ("O2", "O3"):
        net = auto_mixed_precision(Net(), level, BF16)
        out = net(torch.randn(2, 5, 4), mask=torch.ones(2))
        assert out["out"].dtype == F32 and out["pair"][0].dtype == F32
        out["out"].sum().backward()
        assert all(p.grad is not None and p.grad.dtype == F32 for p in net.parameters())
        assert net.scale.dtype == F32


def test_float64_is_left_alone():
    net = auto_mixed_precision(nn.Linear(3, 3).double(), "O3", BF16)
    assert net(torch.randn(2, 3, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.slow
def test_mnist1d_o2_o3_within_one_point_of_o0():
    """MNIST-1D's CNN trained at O0, O2 and O3 (bf16 on CPU): same accuracy within 1 point."""
    mnist1d = pytest.importorskip("mnist1d.data")
    from lit_amp.amp.build import build_train_network
    from lit_amp.demos import CNN1D

    d = mnist1d.make_dataset(mnist1d.get_dataset_args())
    x, y = torch.tensor(d["x"], dtype=F32), torch.tensor(d["y"]).long()
    xt, yt = torch.tensor(d["x_test"], dtype=F32), torch.tensor(d["y_test"]).long()

    def train(level: str) -> float:
        torch.manual_seed(0)
        net = CNN1D()
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        epochs, bs = 20, 100  # O0 88.2 %, O2 and O3 88.6 % (40 epochs: 90.4, 90.0, 90.0)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2,
                                                    total_steps=epochs * len(x) // bs)
        step = build_train_network(net, opt, nn.CrossEntropyLoss(), level)
        g = torch.Generator().manual_seed(0)
        for _ in range(epochs):
            perm = torch.randperm(len(x), generator=g)
            for i in range(0, len(x), bs):
                idx = perm[i : i + bs]
                step(x[idx], y[idx])
                sched.step()
        net.eval()
        with torch.no_grad():
            return (net(xt).argmax(1) == yt).float().mean().item() * 100

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small convs: one thread is faster, and robust on a shared box
    try:
        acc = {lv: train(lv) for lv in ("O0", "O2", "O3")}
    finally:
        torch.set_num_threads(threads)
    assert acc["O0"] > 85, acc
    assert abs(acc["O2"] - acc["O0"]) <= 1.0, acc
    assert abs(acc["O3"] - acc["O0"]) <= 1.0, acc
