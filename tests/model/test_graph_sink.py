"""The sink CUDA graph's runner on CPU: the eager fallback and the runner's bookkeeping with a
stand-in for ``torch.cuda`` (tests/cuda runs the real one; the plan: test_graph_plan.py).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lit_amp import Model
from lit_amp.callbacks import LambdaCallback, LearningRateScheduler
from lit_amp.model import graph_sink, lit_model
from lit_amp.model.graph_sink import SinkGraph
from tests.model._helpers import graph_lit

CUDA = torch.device("cuda")


def test_status_before_any_sink():
    assert graph_lit().sink_graph_status == {"captured": False, "reason": "no sink has run",
                                        "replayed_steps": 0, "eager_steps": 0, "captures": 0}


# ----------------------------------------------------------------------------- CPU: eager
def _data(n: int = 5, batch: int = 16, last: int | None = None):
    g = torch.Generator().manual_seed(3)
    sizes = [batch] * n + ([last] if last else [])
    return [(torch.randn(s, 4, generator=g), torch.randint(0, 2, (s,), generator=g))
            for s in sizes]


def _model(seed: int = 0, momentum: float = 0.9) -> Model:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=momentum)
    model = Model(net, nn.CrossEntropyLoss(), opt, trainer={"accelerator": "cpu"})
    model.lit_model.sink_graph = "auto"
    return model


def test_cpu_sink_runs_eagerly_and_says_why(caplog):
    model = _model()
    with caplog.at_level(logging.INFO, logger="lit_amp.model.graph_sink"):
        model.train(3, _data(), dataset_sink_mode=True, sink_size=4)
    status = model.lit_model.sink_graph_status
    assert status["captured"] is False and status["captures"] == 0
    assert "'cpu'" in status["reason"] and "CUDA device" in status["reason"]
    assert status["eager_steps"] == 12 and status["replayed_steps"] == 0
    said = [r for r in caplog.records if r.name == "lit_amp.model.graph_sink"]
    assert len(said) == 1 and "'cpu'" in said[0].getMessage()  # once per train call
    assert model.lit_model.__dict__["_sink_graph_run"] is None  # released at train end
    model.train(1, _data(), dataset_sink_mode=True, sink_size=2)
    assert model.lit_model.sink_graph_status["eager_steps"] == 2  # counted per train call


def test_sink_graph_true_on_cpu_raises_the_reason():
    model = _model()
    model.lit_model.sink_graph = True
    with pytest.raises(RuntimeError, match="sink_graph=True.*the device is 'cpu'"):
        model.train(1, _data(), dataset_sink_mode=True, sink_size=2)


# ----------------------------------------------------------------------------- the runner
class _FakeGraph:
    """Replays by running the recorded step again, writing into the static tensors."""

    def __init__(self) -> None:
        self.body = None
        self.replays = 0
        self.was_reset = False

    def replay(self) -> None:
        runner, static_batch = self.body
        for p, _ in runner._static_grads:
            p.grad = None  # a captured backward writes the gradients afresh
        loss = SinkGraph._captured_step(runner, static_batch)
        runner._static_loss.copy_(loss)
        for p, g in runner._static_grads:
            g.copy_(p.grad)
            p.grad = g
        self.replays += 1

    def reset(self) -> None:
        self.was_reset = True


class _FakeCuda:
    """``torch.cuda`` as the runner uses it, on CPU."""

    def __init__(self) -> None:
        self.capturing: _FakeGraph | None = None
        self.graphs: list[_FakeGraph] = []
        self.fail_capture = False

    def current_device(self) -> int:
        return 0

    def Stream(self, device=None):  # noqa: N802 - torch's name
        return SimpleNamespace(wait_stream=lambda other: None)

    def current_stream(self, device=None):
        return self.Stream()

    def stream(self, stream):
        return contextlib.nullcontext()

    def device(self, device):
        return contextlib.nullcontext()

    def get_rng_state(self, device=None):
        return torch.zeros(16, dtype=torch.uint8)

    def synchronize(self, device=None) -> None:
        pass

    def CUDAGraph(self):  # noqa: N802 - torch's name
        g = _FakeGraph()
        self.graphs.append(g)
        return g

    @contextlib.contextmanager
    def graph(self, g, stream=None, capture_error_mode="global"):
        assert capture_error_mode == "thread_local"
        self.capturing = g
        try:
            yield
        finally:
            self.capturing = None


class _Emulated(SinkGraph):
    """A runner whose capture records the step without training (as a CUDA capture does)."""

    fake: _FakeCuda

    def __init__(self, lit, device) -> None:
        super().__init__(lit, device)
        self._watch = True

    def _captured_step(self, static_batch):
        fake = self.fake
        if fake.fail_capture:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        fake.capturing.body = (self, static_batch)
        lit = self._lit
        opt = lit.optimizer
        keep = [(t, t.detach().clone()) for t in lit.network.parameters()]
        keep += [(v, v.detach().clone()) for s in opt.state.values() for v in s.values()
                 if torch.is_tensor(v)]
        loss = super()._captured_step(static_batch)
        with torch.no_grad():
            for t, saved in keep:  # capture does not execute: nothing trained
                t.copy_(saved)
        return loss


@pytest.fixture
def emulated(monkeypatch):
    fake = _FakeCuda()
    monkeypatch.setattr(graph_sink, "_cuda", fake)
    monkeypatch.setattr(_Emulated, "fake", fake, raising=False)
    monkeypatch.setattr(lit_model, "SinkGraph", _Emulated)
    real_plan = graph_sink.plan_sink_graph
    monkeypatch.setattr(graph_sink, "plan_sink_graph",
                        lambda lit, device, **kw: real_plan(lit, CUDA, **kw))
    return fake


def _train(model: Model, epochs: int, data, sink_size: int, callbacks=()) -> list:
    losses: list = []
    rec = LambdaCallback(on_train_step_end=lambda rc: losses.append(
        rc.original_args().net_outputs))
    model.train(epochs, data, callbacks=[rec, *callbacks], dataset_sink_mode=True,
                sink_size=sink_size)
    return losses


def _same_weights(a: Model, b: Model) -> bool:
    sa, sb = a.lit_model.network.state_dict(), b.lit_model.network.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa)


def test_runner_warms_up_captures_replays_and_matches_eager(emulated):
    eager, graph = _model(), _model()
    eager.lit_model.sink_graph = False
    data = _data(n=6)
    want = _train(eager, 4, data, sink_size=5)
    got = _train(graph, 4, data, sink_size=5)
    status = graph.lit_model.sink_graph_status
    assert status == {"captured": True, "reason": "", "replayed_steps": 17, "eager_steps": 3,
                      "captures": 1}
    assert len(emulated.graphs) == 1 and emulated.graphs[0].replays == 17
    assert emulated.graphs[0].was_reset  # released at train end
    assert [float(x) for x in got] == [float(x) for x in want]
    assert len({id(x) for x in got}) == 4  # each sink returned its own clone
    assert _same_weights(eager, graph)
    assert graph.trainer.global_step == eager.trainer.global_step == 20
    assert eager.lit_model.sink_graph_status["eager_steps"] == 20


def test_runner_keeps_the_graph_across_sinks_of_size_one(emulated):
    eager, graph = _model(), _model()
    eager.lit_model.sink_graph = False
    want, got = _train(eager, 9, _data(), 1), _train(graph, 9, _data(), 1)
    assert [float(x) for x in got] == [float(x) for x in want]
    assert graph.lit_model.sink_graph_status["captures"] == 1
    assert graph.lit_model.sink_graph_status["replayed_steps"] == 6
    assert _same_weights(eager, graph)


def test_runner_runs_a_batch_of_another_shape_eagerly(emulated):
    eager, graph = _model(), _model()
    eager.lit_model.sink_graph = False
    data = _data(n=4, last=8)  # a last partial batch: steps 5 and 10 of the stream
    want, got = _train(eager, 2, data, 5), _train(graph, 2, data, 5)
    status = graph.lit_model.sink_graph_status
    assert status["captured"] and status["captures"] == 1
    assert status["eager_steps"] == 3 + 2 and status["replayed_steps"] == 5
    assert "2 batch(es) differed" in status["reason"] and "partial" in status["reason"]
    assert [float(x) for x in got] == [float(x) for x in want]
    assert _same_weights(eager, graph)
    for p in graph.lit_model.network.parameters():  # .grad: the last (eager) step's
        assert p.grad is not None


def test_runner_captures_again_when_the_learning_rate_changes(emulated):
    eager, graph = _model(), _model()
    eager.lit_model.sink_graph = False
    halve = [LearningRateScheduler(lambda lr, step: lr * 0.5)]
    want = _train(eager, 4, _data(), 4, halve)
    halve = [LearningRateScheduler(lambda lr, step: lr * 0.5)]
    got = _train(graph, 4, _data(), 4, halve)
    assert graph.lit_model.sink_graph_status["captures"] == 4  # one per sink (new lr)
    assert sum(g.was_reset for g in emulated.graphs) == 4
    assert [float(x) for x in got] == [float(x) for x in want]
    assert _same_weights(eager, graph)


def test_runner_refuses_a_step_that_draws_random_numbers(emulated):
    class Noisy(nn.Module):  # functional dropout: invisible to the plan
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(nn.functional.dropout(x, 0.5, self.training))

    net = Noisy()
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
                  trainer={"accelerator": "cpu"})
    model.lit_model.sink_graph = "auto"
    model.train(2, _data(), dataset_sink_mode=True, sink_size=4)
    status = model.lit_model.sink_graph_status
    assert not status["captured"] and "random numbers" in status["reason"]
    assert status["eager_steps"] == 8 and emulated.graphs == []
    model.lit_model.sink_graph = True
    with pytest.raises(RuntimeError, match="random numbers"):
        model.train(1, _data(), dataset_sink_mode=True, sink_size=4)


def test_runner_falls_back_when_capture_fails(emulated):
    emulated.fail_capture = True
    eager, graph = _model(), _model()
    eager.lit_model.sink_graph = False
    want, got = _train(eager, 2, _data(), 5), _train(graph, 2, _data(), 5)
    status = graph.lit_model.sink_graph_status
    assert not status["captured"] and status["eager_steps"] == 10
    assert "capturing the train step failed (RuntimeError: CUDA error" in status["reason"]
    assert [float(x) for x in got] == [float(x) for x in want]
    assert _same_weights(eager, graph)
    graph.lit_model.sink_graph = True
    with pytest.raises(RuntimeError, match="capturing the train step failed"):
        graph.train(1, _data(), dataset_sink_mode=True, sink_size=5)


def test_runner_turns_the_amp_cast_cache_off_while_a_graph_may_replay(emulated):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
                  amp_level="O3", trainer={"accelerator": "cpu"})
    model.lit_model.sink_graph = "auto"
    seen = []
    rec = LambdaCallback(on_train_step_end=lambda rc: seen.append(net._amp_state.cache_casts))
    model.train(2, _data(), callbacks=[rec], dataset_sink_mode=True, sink_size=5)
    assert model.lit_model.sink_graph_status["captured"]
    assert seen == [False, False] and net._amp_state.cache_casts is True


def test_runner_is_not_copied_with_the_module():
    lit = graph_lit()
    lit.__dict__["_sink_graph_run"] = SinkGraph(lit, torch.device("cpu"))
    assert copy.deepcopy(lit).__dict__["_sink_graph_run"] is None


def test_runner_refuses_optimizer_state_first_made_inside_the_capture(emulated):
    class Late(nn.Module):  # layer b gets its first gradient at the 4th step: the capture
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 2), nn.Linear(4, 2)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return self.a(x) + (self.b(x) if self.calls > 3 else 0)

    net = Late()
    opt = torch.optim.SGD(net.parameters(), 0.1, momentum=0.9)
    model = Model(net, nn.CrossEntropyLoss(), opt, trainer={"accelerator": "cpu"})
    model.lit_model.sink_graph = "auto"
    model.train(1, _data(), dataset_sink_mode=True, sink_size=5)
    status = model.lit_model.sink_graph_status
    assert not status["captured"] and "created state during the capture" in status["reason"]
    assert status["eager_steps"] == 5 and emulated.graphs[0].was_reset
    # the eager re-run of the 4th step made b's momentum buffer from b's gradient alone
    assert all("momentum_buffer" in opt.state[p] for p in net.parameters())


def test_the_graph_modules_use_only_the_public_train_step_seam():
    """graph_plan / graph_sink drive LitModel through public names (train_step.py) and never
    import lit_model: the step has one definition and the layering is one-way."""
    import ast
    from pathlib import Path

    from lit_amp.model import graph_plan

    def is_model(node: ast.AST) -> bool:  # ``lit`` or ``self._lit``
        return (isinstance(node, ast.Name) and node.id == "lit") or (
            isinstance(node, ast.Attribute) and node.attr == "_lit")

    for module in (graph_plan, graph_sink):
        tree = ast.parse(Path(module.__file__).read_text())
        private = sorted({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                          and n.attr.startswith("_") and is_model(n.value)})
        assert private == [], (module.__name__, private)
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "lit_amp.model.lit_model" not in imported, module.__name__
