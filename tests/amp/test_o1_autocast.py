"""Level O1 on ``torch.autocast`` (issue #47 item 1): the built-in O1 computes exactly as a hand
``torch.autocast`` loop, with two hooks on the root instead of a pair per layer; where it departs
from MindSpore's O1 (docs/differences.md, Mixed precision) the departure is what this file
shows; a custom white list keeps MindSpore's mechanism.
"""

from __future__ import annotations

import copy

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_amp.amp.convert import auto_mixed_precision, custom_mixed_precision
from lit_amp.amp.diagnostics import CastCounter
from lit_amp.amp.lists import get_white_list
from lit_amp.demos.nets import ResNet1D
from lit_amp.plugins.precision.amp import AmpPrecision

F32, BF16 = torch.float32, torch.bfloat16


class Block(nn.Module):
    """Convolutions, BatchNorm, LayerNorm, GELU, softmax attention and a residual add."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm1d(4)
        self.fc = nn.Linear(32, 16)
        self.ln = nn.LayerNorm(16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn(self.conv(x[:, None]))).flatten(1)
        h = self.ln(self.fc(h))
        att = torch.softmax(h @ h.T / 4.0, -1)
        return self.head(F.gelu(h + att @ h))


def _train(net: nn.Module, steps: int, autocast: bool) -> list[torch.Tensor]:
    torch.manual_seed(1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))
        with torch.autocast("cpu", BF16, enabled=autocast):
            out = net(x)
        loss = F.cross_entropy(out.float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def test_o1_trains_to_the_hand_autocast_loops_weights_bit_for_bit():
    torch.manual_seed(0)
    net = Block()
    hand = copy.deepcopy(net)
    auto_mixed_precision(net, "O1", BF16)
    ours = _train(net, 5, autocast=False)
    theirs = _train(hand, 5, autocast=True)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert all(p.dtype == F32 for p in net.parameters())


def test_o1_runs_no_hook_and_casts_no_more_than_autocast():
    """ResNet1D: no module hook (the root's forward holds the autocast region), and as many
    cast kernels per step as the hand loop."""

    def casts(net: nn.Module, autocast: bool) -> int:
        x, y = torch.randn(4, 40), torch.randint(0, 10, (4,))
        with CastCounter() as counter:
            with torch.autocast("cpu", BF16, enabled=autocast):
                out = net(x)
            F.cross_entropy(out.float(), y).backward()
        return counter.count

    torch.manual_seed(0)
    net, hand = ResNet1D(), ResNet1D()
    auto_mixed_precision(net, "O1", BF16)
    assert not any(m.__dict__.get("_amp_handles") for m in net.modules())
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in net.modules())
    assert casts(net, False) <= casts(hand, True)


def test_where_o1_departs_from_mindspore():
    """Each departure docs/differences.md names, as computed (CPU, bfloat16)."""
    seen: dict[str, torch.Tensor] = {}

    class Ops(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.cell = nn.LSTMCell(4, 4)
            self.attention = nn.MultiheadAttention(4, 2, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)
            seen.update(
                linear=h,  # MindSpore: the Dense output returns to float32
                gelu_after_linear=F.gelu(h),  # MindSpore: float32 (not white-listed)
                relu_of_float32=F.relu(x),  # MindSpore: low (ReLU is white-listed)
                outer=torch.outer(x[0], x[1]),  # MindSpore: low (Ger is white-listed)
                einsum=torch.einsum("ij,jk->ik", x, x.T),  # MindSpore: float32
                addmm=torch.addmm(x, x, x.T @ x),  # MindSpore: float32
                baddbmm=torch.baddbmm(x[None], x[None], (x.T @ x)[None]),  # MindSpore: float32
                sdpa=F.scaled_dot_product_attention(x[None], x[None], x[None]),  # float32
                attention=self.attention(x[None], x[None], x[None])[0],  # MindSpore: float32
                lstm_cell=self.cell(x)[0],  # as MindSpore: low compute, float32 output
            )
            return h.sum()

    net = auto_mixed_precision(Ops(), "O1", BF16)
    x = torch.randn(3, 4)
    net(x)
    dtypes = {k: v.dtype for k, v in seen.items()}
    assert dtypes == {"linear": BF16, "gelu_after_linear": BF16, "relu_of_float32": F32,
                      "outer": F32, "einsum": BF16, "addmm": BF16, "baddbmm": BF16,
                      "sdpa": BF16, "attention": BF16, "lstm_cell": F32}
    # the cell computed in bfloat16 (MindSpore's white list), its output cast back
    cell = copy.deepcopy(net.cell).to(BF16)
    assert torch.equal(seen["lstm_cell"], cell(x.to(BF16))[0].float())
    # the mechanism MindSpore's O1 has stays one argument away: a custom white list
    exact = custom_mixed_precision(copy.deepcopy(Ops()), white_list=get_white_list(),
                                   dtype=BF16)
    exact(x)
    assert seen["linear"].dtype == F32 and seen["gelu_after_linear"].dtype == F32


def test_a_loss_module_inside_an_o1_network_computes_in_float32():
    class MatmulLoss(nn.modules.loss._Loss):
        def forward(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            self.product = out @ target.T  # autocast would take a matmul to the low dtype
            return self.product.mean()

    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.loss = nn.Linear(4, 4), MatmulLoss()

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.loss(self.fc(x), y)

    net = auto_mixed_precision(WithLoss(), "O1", BF16)
    loss = net(torch.randn(3, 4), torch.randn(3, 4))
    assert net.loss.product.dtype == F32 and loss.dtype == F32


def test_a_float64_input_is_cast_as_mindspore_casts_it():
    net = auto_mixed_precision(nn.Sequential(nn.Linear(3, 2)), "O1", BF16)
    out = net(torch.ones(4, 3, dtype=torch.float64))
    assert out.dtype == F32


class _Lit(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = Block()
        self.autocast_seen: list[bool] = []

    def training_step(self, batch: tuple, _: int) -> torch.Tensor:
        x, y = batch
        self.autocast_seen.append(torch.is_autocast_enabled("cpu"))
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("plugin", ["AmpPrecision('O1')", "Model"])
def test_amp_precision_o1_trains_as_lightnings_bf16_mixed(plugin: str, tmp_path) -> None:
    """The same weights as ``Trainer(precision="bf16-mixed")``, bit for bit: the training step
    (training_step included) runs in the same autocast region."""
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,)))

    def fit(**kw) -> _Lit:
        lit = _Lit()
        trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=tmp_path, **kw)
        trainer.fit(lit, torch.utils.data.DataLoader(data, batch_size=8))
        return lit

    ref = [p.detach() for p in fit(precision="bf16-mixed").net.parameters()]
    if plugin == "Model":
        from lit_amp.model.model import Model

        torch.manual_seed(0)
        net = Block()
        Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
              amp_level="O1").train(2, torch.utils.data.DataLoader(data, batch_size=8))
        ours = list(net.parameters())
    else:
        lit = fit(plugins=[AmpPrecision("O1", dtype=BF16)])
        assert lit.autocast_seen and all(lit.autocast_seen)
        ours = list(lit.net.parameters())
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))


@pytest.mark.slow
def test_torch_compile_of_an_o1_network_trains_like_the_eager_one():
    """The autocast region is a ``with`` block in the root's forward, which Dynamo traces (a
    region entered by a pre-hook and left by a post-hook is not)."""
    import shutil

    if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        pytest.skip("TorchInductor on the CPU compiles C++: no C compiler on this machine")
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    hand = copy.deepcopy(net)
    auto_mixed_precision(net, "O1", BF16)
    compiled = torch.compile(net)
    ours = _train(compiled, 3, autocast=False)
    theirs = _train(hand, 3, autocast=True)
    assert all(torch.allclose(a, b, rtol=1e-2, atol=1e-3) for a, b in zip(ours, theirs))
    assert compiled(torch.randn(2, 8)).dtype == F32


def test_an_o1_network_pickles_and_deep_copies():
    import pickle

    net = auto_mixed_precision(Block(), "O1", BF16)
    x = torch.randn(4, 8)
    net.eval()
    for twin in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        assert torch.equal(twin(x), net(x))
        assert twin.forward.args[1] is twin  # its own forward, not the original's
