"""Whether a sink's train step may be captured as a CUDA graph (``lit_amp.model.graph_plan``):
every reason the plan finds on the host, the ``sink_graph`` setting and its validation.
"""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch import nn

from lit_amp import FixedLossScaleManager, LitModel
from lit_amp.model.graph_plan import SinkGraphPlan, check_sink_graph, plan_sink_graph
from tests.model._helpers import graph_lit

CUDA = torch.device("cuda")

def _refused(plan: SinkGraphPlan, *words: str) -> None:
    assert plan.capture is False, plan
    for w in words:
        assert w in plan.reason, (w, plan.reason)


# ----------------------------------------------------------------------------- plan: allowed
@pytest.mark.parametrize("make_opt", [
    lambda p: torch.optim.SGD(p, lr=0.1),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
    lambda p: torch.optim.Adam(p, lr=1e-3, capturable=True),
    lambda p: torch.optim.AdamW(p, lr=1e-3, capturable=True),
], ids=["sgd", "sgd-momentum", "adam-capturable", "adamw-capturable"])
def test_plan_allows_known_safe_optimizers_on_cuda(make_opt):
    assert plan_sink_graph(graph_lit(opt=make_opt), CUDA) == SinkGraphPlan(True, "")


def test_plan_allows_eval_mode_or_zero_dropout_and_amp_without_loss_scaling():
    net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Dropout(0.0), nn.Linear(8, 2))
    net[1].eval()
    assert plan_sink_graph(graph_lit(net), CUDA).capture
    for level in ("O1", "O3"):  # float16 on CUDA without loss scaling
        lit = graph_lit(amp_level=level)
        lit.apply_amp(CUDA)
        assert plan_sink_graph(lit, CUDA).capture, level


# ----------------------------------------------------------------------------- plan: refusals
def test_plan_refuses_a_device_other_than_cuda():
    _refused(plan_sink_graph(graph_lit(), "cpu"), "'cpu'", "CUDA device")


@pytest.mark.parametrize("setting", [False, "off"])
def test_plan_refuses_when_turned_off(setting):
    _refused(plan_sink_graph(graph_lit(), CUDA, setting=setting), "turns capture off")
    lit = graph_lit()
    lit.sink_graph = setting
    _refused(plan_sink_graph(lit, CUDA), "turns capture off")


def test_plan_refuses_without_optimizer():
    lit = LitModel(nn.Linear(4, 2), nn.CrossEntropyLoss())
    _refused(plan_sink_graph(lit, CUDA, setting="auto"), "no optimizer")


@pytest.mark.parametrize("manager", ["fixed-no-drop", "fixed", "o2-dynamic"])
def test_plan_refuses_any_loss_scaling(manager):
    if manager == "o2-dynamic":
        lit = graph_lit(amp_level="O2")  # O2 on CUDA: float16 with dynamic loss scaling
        lit.apply_amp(CUDA)
    else:
        lit = graph_lit(loss_scale_manager=FixedLossScaleManager(
            128.0, drop_overflow_update=manager == "fixed"))
        lit.apply_amp("cpu")
    assert lit.loss_scale is not None and lit.loss_scale.enabled
    _refused(plan_sink_graph(lit, CUDA), "loss scaling", "loss_scale_manager=None")


def test_plan_refuses_an_amp_level_not_applied_yet():
    _refused(plan_sink_graph(graph_lit(amp_level="O3"), CUDA), "not applied")


def test_plan_refuses_gradient_accumulation():
    lit = graph_lit()
    lit.grad_accumulation_steps = 4  # what boost's GradientAccumulation sets
    _refused(plan_sink_graph(lit, CUDA), "accumulation over 4")
    trainer = SimpleNamespace(world_size=1, accumulate_grad_batches=2, callbacks=[])
    _refused(plan_sink_graph(graph_lit(), CUDA, trainer=trainer), "accumulation over 2")


def test_plan_refuses_more_than_one_process():
    trainer = SimpleNamespace(world_size=2, callbacks=[])
    _refused(plan_sink_graph(graph_lit(), CUDA, trainer=trainer), "2 processes")


def test_plan_refuses_thor_and_unknown_optimizers():
    from lit_amp.thor.optimizer import thor

    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    _refused(plan_sink_graph(graph_lit(net, thor(net, 0.05, 0.03, 0.9, frequency=2)), CUDA), "THOR")
    _refused(plan_sink_graph(graph_lit(opt=lambda p: torch.optim.RMSprop(p)), CUDA),
             "RMSprop", "not known to be capture-safe")

    class MySGD(torch.optim.SGD):  # a subclass may add host reads to step()
        pass

    _refused(plan_sink_graph(graph_lit(opt=lambda p: MySGD(p, lr=0.1)), CUDA), "MySGD")


@pytest.mark.parametrize("kind", [torch.optim.Adam, torch.optim.AdamW])
def test_plan_refuses_adam_without_capturable(kind):
    _refused(plan_sink_graph(graph_lit(opt=lambda p: kind(p, lr=1e-3)), CUDA),
             f"{kind.__name__}(..., capturable=True)")


def test_plan_refuses_tensor_hyperparameters_differentiable_and_step_hooks():
    _refused(plan_sink_graph(graph_lit(opt=lambda p: torch.optim.SGD(p, lr=torch.tensor(0.1))),
                             CUDA), "lr as a tensor")
    differentiable = graph_lit(opt=lambda p: torch.optim.SGD(p, lr=0.1, differentiable=True))
    _refused(plan_sink_graph(differentiable, CUDA), "differentiable=True")
    lit = graph_lit()
    handle = lit.optimizer.register_step_pre_hook(lambda opt, args, kwargs: None)
    _refused(plan_sink_graph(lit, CUDA), "step hooks")
    handle.remove()
    assert plan_sink_graph(lit, CUDA).capture


def test_plan_refuses_boost_level_and_boost_callbacks():
    from lit_amp import AutoBoost

    boosted = graph_lit(boost_level="O1", metrics={"acc"})
    _refused(plan_sink_graph(boosted, CUDA), "boost_level='O1'")
    trainer = SimpleNamespace(world_size=1, callbacks=[AutoBoost("O1")])
    _refused(plan_sink_graph(graph_lit(), CUDA, trainer=trainer), "boost callbacks", "AutoBoost")


@pytest.mark.parametrize("module,words", [
    (nn.Dropout(0.1), ("Dropout", "random")),
    (nn.AlphaDropout(0.2), ("AlphaDropout", "random")),
    (nn.RReLU(), ("RReLU", "random")),
    (nn.BatchNorm1d(8, momentum=None), ("momentum=None",)),
])
def test_plan_refuses_modules_that_are_not_graph_safe(module, words):
    net = nn.Sequential(nn.Linear(4, 8), module, nn.Linear(8, 2))
    _refused(plan_sink_graph(graph_lit(net), CUDA), *words, "'1'")


def test_plan_refuses_sparse_embeddings():
    class Bag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4, sparse=True)
            self.out = nn.Linear(4, 2)

        def forward(self, x):
            return self.out(self.emb(x).mean(1))

    _refused(plan_sink_graph(graph_lit(Bag()), CUDA), "sparse gradients")


def test_plan_refuses_a_subclass_that_overrides_the_train_step():
    class Mine(LitModel):
        def train_one_step(self, batch):
            return super().train_one_step(batch)

    net = nn.Linear(4, 2)
    lit = Mine(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1))
    lit.sink_graph = "auto"
    _refused(plan_sink_graph(lit, CUDA), "overrides train_one_step")


def test_plan_refuses_per_step_lightning_hooks_and_anomaly_detection():
    class GradHook(L.Callback):
        def on_after_backward(self, trainer, pl_module):
            pass

    quiet = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False,
             "enable_model_summary": False}
    _refused(plan_sink_graph(graph_lit(), CUDA, trainer=L.Trainer(callbacks=[GradHook()], **quiet)),
             "gradient hook")
    assert plan_sink_graph(graph_lit(), CUDA, trainer=L.Trainer(**quiet)).capture
    _refused(plan_sink_graph(graph_lit(), CUDA, trainer=L.Trainer(detect_anomaly=True, **quiet)),
             "detect_anomaly")
    with torch.autograd.set_detect_anomaly(True):
        _refused(plan_sink_graph(graph_lit(), CUDA), "anomaly detection")


def test_plan_lists_every_reason():
    plan = plan_sink_graph(graph_lit(opt=lambda p: torch.optim.Adam(p)), "cpu")
    _refused(plan, "'cpu'", "capturable=True")
    assert plan.reason.count("; ") == 1


# ----------------------------------------------------------------------------- the setting
def test_sink_graph_is_off_unless_asked_for():
    net = nn.Linear(4, 2)
    lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1))
    assert lit.sink_graph is False
    _refused(plan_sink_graph(lit, CUDA), "sink_graph=False turns capture off")


def test_user_hooks_are_refused_but_lit_amps_casts_are_not():
    from lit_amp.amp.convert import custom_mixed_precision

    o3 = graph_lit(amp_level="O3")  # no loss scaling by default; O3 replaces forwards
    o3.apply_amp(CUDA)
    assert plan_sink_graph(o3, CUDA).capture
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    custom_mixed_precision(net, white_list=[nn.Linear], dtype=torch.bfloat16)
    assert net[0]._forward_pre_hooks  # a custom white list casts through lit_amp's hooks
    lit = graph_lit(net)
    assert plan_sink_graph(lit, CUDA).capture
    handle = lit.loss_fn.register_forward_hook(lambda m, a, out: None)
    _refused(plan_sink_graph(lit, CUDA), "hooks would run once", "CrossEntropyLoss")
    handle.remove()
    handle = net[2].weight.register_hook(lambda g: g)
    _refused(plan_sink_graph(lit, CUDA), "parameter '2.weight'")
    handle.remove()
    handle = nn.modules.module.register_module_forward_hook(lambda m, a, out: None)
    try:
        _refused(plan_sink_graph(lit, CUDA), "global module hooks")
    finally:
        handle.remove()
    assert plan_sink_graph(lit, CUDA).capture


def test_sink_graph_setting_validation():
    lit = graph_lit()
    assert lit.sink_graph == "auto"
    for ok in (True, False, "off", "auto"):
        lit.sink_graph = ok
        assert lit.sink_graph == ok
    with pytest.raises(TypeError, match="'sink_graph' must be True, False, 'auto' or 'off'"):
        lit.sink_graph = 1
    with pytest.raises(TypeError, match="'sink_graph'"):
        lit.sink_graph = None
    with pytest.raises(ValueError, match="'sink_graph' must be True, False, 'auto' or 'off'"):
        lit.sink_graph = "on"
    assert lit.sink_graph == "auto"  # a refused value leaves the setting as it was
    with pytest.raises(ValueError, match="'sink_graph'"):
        plan_sink_graph(lit, CUDA, setting="always")
    assert check_sink_graph("off") == "off"
