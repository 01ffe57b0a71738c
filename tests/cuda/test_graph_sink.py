"""Sink mode on CUDA with the train step captured as a CUDA graph (``LitModel.sink_graph``).

An MNIST-1D-shaped problem (40 features, 10 classes, batch 100, seeded) on an MLP: the graph
run's losses and weights must be those of eager training (non-sink, and sink with
``sink_graph=False``); an LR change between sinks, a last partial batch and AMP's cast cache
are covered; Adam without ``capturable=True`` falls back with the reason. On the CPU
(``LIT_AMP_CUDA_TESTS_ON=cpu``) capture is refused and every run is eager, so the same
comparisons hold and the status names the CPU. Run with ``-s`` to see the measured differences
and the throughput.
"""

from __future__ import annotations

import time

import lightning as L
import pytest
import torch
from torch import nn

from lit_amp import Model
from lit_amp.callbacks import LambdaCallback, LearningRateScheduler

pytestmark = pytest.mark.cuda

BATCH, FEATURES, CLASSES = 100, 40, 10
TOL = 1e-6  # largest |graph - eager| accepted (expected: 0, the same kernels)


def _data(n_batches: int = 12, last: int | None = None, seed: int = 7) -> list:
    """MNIST-1D-shaped synthetic batches (CPU tensors), optionally a last partial one."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(CLASSES, FEATURES, generator=g)
    sizes = [BATCH] * n_batches + ([last] if last else [])
    out = []
    for s in sizes:
        y = torch.randint(0, CLASSES, (s,), generator=g)
        out.append((centers[y] + 0.8 * torch.randn(s, FEATURES, generator=g), y))
    return out


def _mlp(hidden: int = 100, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, CLASSES))


def _optimizer(kind: str, params, on_cuda: bool) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05)
    if kind == "sgd_momentum":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if kind == "adam_capturable":  # capturable needs CUDA tensors (on the CPU: plain Adam)
        return torch.optim.Adam(params, lr=1e-3, capturable=on_cuda)
    if kind == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    raise AssertionError(kind)


def _run(accelerator: dict, on_cuda: bool, *, epochs: int, data: list, sink_size: int = 0,
         sink_graph: bool | str = "auto", opt: str = "sgd", hidden: int = 100,
         amp_level: str = "O0", callbacks: tuple = (), **trainer: object,
         ) -> tuple[list[float], dict, Model]:
    """Train a fresh (seeded) MLP; returns (losses per step / per sink, weights, model)."""
    net = _mlp(hidden)
    model = Model(net, nn.CrossEntropyLoss(), _optimizer(opt, net.parameters(), on_cuda),
                  amp_level=amp_level, trainer={**accelerator, **trainer})
    model.lit_model.sink_graph = sink_graph
    losses: list[float] = []
    rec = LambdaCallback(on_train_step_end=lambda rc: losses.append(
        float(rc.original_args().net_outputs)))
    sink = {"dataset_sink_mode": True, "sink_size": sink_size} if sink_size else {}
    model.train(epochs, data, callbacks=[rec, *callbacks], **sink)
    weights = {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}
    return losses, weights, model


def _max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max(abs(x - y) for x, y in zip(a, b))


def _weights_diff(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def _expect_status(model: Model, on_cuda: bool, *, replayed: int | None = None,
                   eager: int | None = None) -> dict:
    status = model.lit_model.sink_graph_status
    if on_cuda:
        assert status["captured"] is True, status
        assert status["replayed_steps"] > 0, status
        if replayed is not None:
            assert status["replayed_steps"] == replayed, status
        if eager is not None:
            assert status["eager_steps"] == eager, status
    else:
        assert status["captured"] is False and status["replayed_steps"] == 0, status
        assert "'cpu'" in status["reason"], status
    return status


@pytest.mark.parametrize("opt", ["sgd", "sgd_momentum", "adam_capturable"])
def test_graph_sink_losses_equal_eager(device, on_cuda, accelerator, exact_fp32, opt):
    data = _data(12)  # 24 steps: 2 passes
    plain, w_plain, _ = _run(accelerator, on_cuda, epochs=2, data=data, opt=opt)
    # sinks of 6 steps: the graph replays inside each sink (4 sinks, per-sink losses)
    graph, w_graph, m_graph = _run(accelerator, on_cuda, epochs=4, data=data, sink_size=6,
                                   opt=opt)
    eager, w_eager, _ = _run(accelerator, on_cuda, epochs=4, data=data, sink_size=6, opt=opt,
                             sink_graph=False)
    _expect_status(m_graph, on_cuda, replayed=21, eager=3)
    assert m_graph.trainer.global_step == 24  # Lightning counted every replayed step
    d_sink = _max_diff(graph, eager)
    d_plain = _max_diff(graph, plain[5::6])
    d_w = max(_weights_diff(w_graph, w_eager), _weights_diff(w_graph, w_plain))
    print(f"\n[{opt}] sink_size=6: max |loss graph - sink eager| = {d_sink:.3g}, "
          f"|loss graph - non-sink| = {d_plain:.3g}, max |weights diff| = {d_w:.3g}")
    assert d_sink <= TOL and d_plain <= TOL and d_w <= TOL


def test_graph_sink_per_step_losses_equal_eager(device, on_cuda, accelerator, exact_fp32):
    # sinks of one step: the graph is kept across sinks, so every step's loss is compared
    data = _data(12)
    plain, _, _ = _run(accelerator, on_cuda, epochs=2, data=data, opt="sgd_momentum")
    graph, w_graph, m_graph = _run(accelerator, on_cuda, epochs=24, data=data, sink_size=1,
                                   opt="sgd_momentum")
    eager, w_eager, _ = _run(accelerator, on_cuda, epochs=24, data=data, sink_size=1,
                             opt="sgd_momentum", sink_graph=False)
    status = _expect_status(m_graph, on_cuda, replayed=21, eager=3)
    if on_cuda:
        assert status["captures"] == 1  # one graph for the whole train call
    d = max(_max_diff(graph, plain), _max_diff(graph, eager))
    print(f"\nper-step (24 steps): max |loss graph - eager| = {d:.3g}, weights "
          f"{_weights_diff(w_graph, w_eager):.3g}")
    assert d <= TOL and _weights_diff(w_graph, w_eager) <= TOL


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_graph_sink_with_gradient_clipping(device, on_cuda, accelerator, exact_fp32, algorithm):
    data = _data(12)
    clip = {"gradient_clip_val": 0.05, "gradient_clip_algorithm": algorithm}
    graph, w_graph, m_graph = _run(accelerator, on_cuda, epochs=4, data=data, sink_size=6,
                                   opt="sgd_momentum", **clip)
    eager, w_eager, _ = _run(accelerator, on_cuda, epochs=4, data=data, sink_size=6,
                             opt="sgd_momentum", sink_graph=False, **clip)
    unclipped, _, _ = _run(accelerator, on_cuda, epochs=4, data=data, sink_size=6,
                           opt="sgd_momentum", sink_graph=False)
    _expect_status(m_graph, on_cuda, replayed=21, eager=3)
    d, d_w = _max_diff(graph, eager), _weights_diff(w_graph, w_eager)
    print(f"\nclip by {algorithm}: max |loss diff| = {d:.3g}, max |weights diff| = {d_w:.3g}")
    assert d <= TOL and d_w <= TOL
    assert _max_diff(graph, unclipped) > 1e-4  # the clipping acted


def test_graph_sink_honours_an_lr_change_between_sinks(device, on_cuda, accelerator,
                                                       exact_fp32):
    data = _data(12)

    def halve():
        return (LearningRateScheduler(lambda lr, step: lr * 0.5),)  # after every sink

    graph, w_graph, m_graph = _run(accelerator, on_cuda, epochs=6, data=data, sink_size=4,
                                   opt="sgd_momentum", callbacks=halve())
    eager, w_eager, _ = _run(accelerator, on_cuda, epochs=6, data=data, sink_size=4,
                             opt="sgd_momentum", callbacks=halve(), sink_graph=False)
    status = _expect_status(m_graph, on_cuda, replayed=21, eager=3)
    if on_cuda:
        assert status["captures"] == 6, status  # captured again for each new lr
    lr = m_graph.lit_model.optimizer.param_groups[0]["lr"]
    assert lr == pytest.approx(0.05 / 2**6)
    d, d_w = _max_diff(graph, eager), _weights_diff(w_graph, w_eager)
    print(f"\nLR halved per sink: max |loss diff| = {d:.3g}, max |weights diff| = {d_w:.3g}")
    assert d <= TOL and d_w <= TOL


def test_graph_sink_runs_a_last_partial_batch_eagerly(device, on_cuda, accelerator,
                                                      exact_fp32):
    data = _data(11, last=50)  # 12 batches, the 12th of 50 samples: steps 12 and 24
    graph, w_graph, m_graph = _run(accelerator, on_cuda, epochs=4, data=data, sink_size=6)
    eager, w_eager, _ = _run(accelerator, on_cuda, epochs=4, data=data, sink_size=6,
                             sink_graph=False)
    plain, w_plain, _ = _run(accelerator, on_cuda, epochs=2, data=data)
    status = _expect_status(m_graph, on_cuda, replayed=19, eager=3 + 2)
    if on_cuda:
        assert "2 batch(es) differed" in status["reason"], status
    d = max(_max_diff(graph, eager), _max_diff(graph, plain[5::6]))
    d_w = max(_weights_diff(w_graph, w_eager), _weights_diff(w_graph, w_plain))
    print(f"\npartial batch: max |loss diff| = {d:.3g}, max |weights diff| = {d_w:.3g}")
    assert d <= TOL and d_w <= TOL


def test_graph_sink_amp_o3_refreshes_the_low_precision_weights(device, on_cuda, accelerator):
    # hidden=512: the 512x512 weight is large enough for AMP's cast cache (>= 2**18 elements),
    # which a replay would leave stale; the graph runs with the cache off, then restores it
    data = _data(12)
    graph, w_graph, m_graph = _run(accelerator, on_cuda, epochs=4, data=data, sink_size=6,
                                   hidden=512, amp_level="O3")
    eager, w_eager, _ = _run(accelerator, on_cuda, epochs=4, data=data, sink_size=6,
                             hidden=512, amp_level="O3", sink_graph=False)
    _expect_status(m_graph, on_cuda, replayed=21, eager=3)
    assert m_graph.lit_model.network._amp_state.cache_casts is True  # restored at train end
    d, d_w = _max_diff(graph, eager), _weights_diff(w_graph, w_eager)
    print(f"\nO3: max |loss diff| = {d:.3g}, max |weights diff| = {d_w:.3g}")
    assert d <= TOL and d_w <= TOL
    assert len(set(graph)) > 1  # the loss moved: the low-precision weights followed


def test_adam_without_capturable_falls_back_with_the_reason(device, on_cuda, accelerator):
    data = _data(6)
    _, _, model = _run(accelerator, on_cuda, epochs=2, data=data, sink_size=3, opt="adam")
    status = model.lit_model.sink_graph_status
    assert status["captured"] is False and status["replayed_steps"] == 0
    assert status["eager_steps"] == 6
    assert "Adam(..., capturable=True)" in status["reason"], status
    with pytest.raises(RuntimeError, match=r"sink_graph=True.*capturable=True"):
        _run(accelerator, on_cuda, epochs=1, data=data, sink_size=3, opt="adam",
             sink_graph=True)


class _Plain(L.LightningModule):
    """A plain Lightning loop: automatic optimization, one batch per step."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.loss = nn.CrossEntropyLoss()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class _Clock(L.Callback):
    def __init__(self, on_cuda: bool) -> None:
        self.on_cuda = on_cuda
        self.seconds = 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        if self.on_cuda:
            torch.cuda.synchronize()
        self.t0 = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        if self.on_cuda:
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self.t0


def test_graph_sink_throughput(device, on_cuda, accelerator):
    steps = 1200 if on_cuda else 24
    data = _data(steps // 2)
    rates = {}
    clock = _Clock(on_cuda)
    trainer = L.Trainer(max_epochs=2, callbacks=[clock], enable_checkpointing=False,
                        **accelerator)  # nothing written into the working dir
    loader = torch.utils.data.DataLoader(data, batch_size=None)  # the batches as they are
    trainer.fit(_Plain(_mlp()), train_dataloaders=loader)
    rates["plain Lightning"] = steps / clock.seconds
    for name, graph in (("sink eager", False), ("sink graph", "auto")):
        clock = _Clock(on_cuda)
        net = _mlp()
        model = Model(net, nn.CrossEntropyLoss(),
                      torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
                      trainer=dict(accelerator))
        model.lit_model.sink_graph = graph
        model.train(4, data, callbacks=[clock], dataset_sink_mode=True, sink_size=steps // 4)
        rates[name] = steps / clock.seconds
        if graph:
            _expect_status(model, on_cuda)
    ratio = rates["sink graph"] / rates["plain Lightning"]
    print("\n" + ", ".join(f"{k}: {v:.0f} steps/s" for k, v in rates.items())
          + f"; graph / plain Lightning = {ratio:.2f}x ({device})")
    if on_cuda:
        assert rates["sink graph"] > rates["sink eager"]
