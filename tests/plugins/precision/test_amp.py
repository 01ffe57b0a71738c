"""AmpPrecision (and its FSDP twin) in Lightning's Trainer, on CPU."""

from __future__ import annotations

import json
import os
import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_amp.amp.convert import auto_mixed_precision
from lit_amp.amp.levels import resolve_amp_config
from lit_amp.amp.loss_scale.controller import LossScaleController
from lit_amp.amp.loss_scale.managers import DynamicLossScaleManager, FixedLossScaleManager
from lit_amp.plugins.precision.amp import STATE_KEY, AmpPrecision
from lit_amp.plugins.precision.fsdp import AmpFSDPPrecision

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


class _WatchedLayerNorm(nn.LayerNorm):
    """A LayerNorm whose watchers see the input its own forward computes with (O2 casts an
    island's input inside the forward, after any forward pre-hook)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.watchers: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.watchers:
            w(self, (x,))
        return super().forward(x)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 16),
        _WatchedLayerNorm(16), nn.Linear(16, 3),
    )


def loader(n: int = 64, batch: int = 8, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    ds = TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g))
    return DataLoader(ds, batch_size=batch, shuffle=False)


class _Watch:
    """Forward pre-hook recording the dtypes a layer computes with (picklable for ddp_spawn)."""

    def __init__(self, record: list, tag: int) -> None:
        self.record, self.tag = record, tag

    def __call__(self, m: nn.Module, args: tuple) -> None:
        self.record.append({"layer": self.tag, "in": args[0].dtype, "w": m.weight.dtype})


class LM(pl.LightningModule):
    def __init__(self, lr: float = 0.1, sched: bool = False) -> None:
        super().__init__()
        self.model = make_model()
        self.loss_fn = nn.CrossEntropyLoss()
        self.lr, self.sched = lr, sched
        self.record: list[dict] = []
        self._watch()

    def _watch(self) -> None:
        for i, m in enumerate(self.model):
            if isinstance(m, _WatchedLayerNorm):
                m.watchers.append(_Watch(self.record, i))
            elif hasattr(m, "weight"):
                m.register_forward_pre_hook(_Watch(self.record, i))

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.model(x)
        loss = self.loss_fn(out, y)
        self.record.append({"out": out.dtype, "loss": loss.dtype})
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr)
        if not self.sched:
            return opt
        sch = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sch, "interval": "step"}}


def trainer(plugin, tmp_path=None, **kw) -> pl.Trainer:
    args = dict(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, plugins=[plugin])
    if tmp_path is not None:
        args["default_root_dir"] = str(tmp_path)
    args.update(kw)
    return pl.Trainer(**args)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*(float16|bf16-mixed|16-mixed|num_workers).*")
        yield


@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_levels_inside_the_trainer(level):
    lm = LM()
    plugin = AmpPrecision(level)
    trainer(plugin, max_steps=2).fit(lm, loader())
    low = BF16  # CPU default
    exp = {
        "O0": dict.fromkeys((0, 1, 3, 4, 5), F32),
        # O1 runs on torch.autocast: the weights stay float32 up to the op (autocast casts them
        # there), and every layer after the first takes the low activation handed on
        "O1": dict.fromkeys((0, 1, 3, 4, 5), F32),
        "O2": {0: low, 1: F32, 3: low, 4: F32, 5: low},
        "O3": dict.fromkeys((0, 1, 3, 4, 5), low),
    }[level]
    # O2's BatchNorm (layer 1) computes in fp32 from the low activation: fp32 weights, low input
    inputs = {**exp, 1: low} if level == "O2" else exp
    if level == "O1":
        inputs = {0: F32, 1: low, 3: low, 4: low, 5: low}
    layers = [r for r in lm.record if "layer" in r]
    assert {r["layer"]: r["w"] for r in layers} == exp
    assert all(r["in"] == inputs[r["layer"]] for r in layers)
    steps = [r for r in lm.record if "out" in r]
    assert all(r["out"] == F32 and r["loss"] == F32 for r in steps)  # model output, loss fp32
    assert all(p.dtype == F32 for p in lm.parameters())
    assert plugin.precision == ("32-true" if level == "O0" else "bf16-mixed")
    assert plugin.config.dtype == BF16 and plugin.loss_scale_manager is not None


def test_plugin_computes_like_a_raw_loop_after_auto_mixed_precision():
    lm = LM()
    trainer(AmpPrecision("O2"), max_steps=6).fit(lm, loader())
    net = auto_mixed_precision(make_model(), "O2", BF16)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for i, (x, y) in enumerate(loader()):
        if i == 6:
            break
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    for a, b in zip(lm.model.state_dict().values(), net.state_dict().values()):
        assert torch.equal(a, b)


def test_o1_intercepts_functional_ops_in_training_step():
    class FnLM(LM):
        def training_step(self, batch, batch_idx):
            x, y = batch
            w = self.model[0].weight
            z = torch.matmul(x, w.t())  # functional, in the step itself
            self.record.append({"z": torch.equal(z, (x.to(BF16) @ w.t().to(BF16)).float())})
            return super().training_step(batch, batch_idx)

    lm = FnLM()
    trainer(AmpPrecision("O1"), max_steps=1).fit(lm, loader())
    assert [r["z"] for r in lm.record if "z" in r] == [True]


def test_dynamic_loss_scaling_skip_schedule_log_and_checkpoint(tmp_path):
    lm = LM(sched=True)
    plugin = AmpPrecision("O2", dtype=F16,
                          loss_scale_manager=DynamicLossScaleManager(2.0**20, 2, 3))
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)
    tr = trainer(plugin, tmp_path, max_steps=8, enable_checkpointing=True, callbacks=[ckpt],
                 logger=pl.loggers.CSVLogger(tmp_path), log_every_n_steps=1)
    tr.fit(lm, loader())
    ctl = plugin.controller
    assert plugin.precision == "16-mixed"
    assert ctl.steps == 8 and ctl.skipped_steps >= 1
    assert plugin.skipped_steps == ctl.skipped_steps and plugin.loss_scale == ctl.scale
    # the LR schedule advanced only on applied steps
    lr = tr.optimizers[0].param_groups[0]["lr"]
    assert lr == pytest.approx(0.1 * 0.5 ** (8 - ctl.skipped_steps))
    assert tr.callback_metrics["loss_scale"] == ctl.scale
    assert tr.callback_metrics["skipped_steps"] == ctl.skipped_steps
    # checkpoint: stable key + Lightning's class key
    state = torch.load(ckpt.last_model_path, weights_only=False)
    assert state[STATE_KEY]["scale"] == ctl.scale
    assert state["AmpPrecision"][STATE_KEY]["steps"] == 8

    # resume with a renamed subclass: the stable key restores the scale state
    class RenamedPrecision(AmpPrecision):
        pass

    plugin2 = RenamedPrecision("O2", dtype=F16,
                               loss_scale_manager=DynamicLossScaleManager(2.0**20, 2, 3))
    tr2 = trainer(plugin2, tmp_path, max_steps=9, max_epochs=2)
    tr2.fit(LM(sched=True), loader(), ckpt_path=ckpt.last_model_path)
    assert plugin2.controller.steps == 9
    assert plugin2.controller.skipped_steps >= ctl.skipped_steps


def test_bfloat16_has_no_loss_scaling_by_default():
    plugin = AmpPrecision("O2")
    trainer(plugin, max_steps=2).fit(LM(), loader())
    assert not plugin.controller.enabled and plugin.state_dict() == {}


def test_manual_optimization_two_optimizers_one_update_per_step():
    class TwoOpt(LM):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.scales = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            o1, o2 = self.optimizers()
            for opt in (o1, o2):
                opt.zero_grad()
                loss = self.loss_fn(self.model(x), y)
                self.manual_backward(loss)
                self.clip_gradients(opt, gradient_clip_val=1e3, gradient_clip_algorithm="norm")
                params = [p for g in opt.param_groups for p in g["params"]]
                total = torch.stack([p.grad.norm() for p in params]).norm()
                assert total < 50  # unscaled before clipping (scaled: ~4e3x, clipped to 1e3)
                opt.step()
            self.scales.append(self.trainer.precision_plugin.controller.steps)

        def configure_optimizers(self):
            half = len(list(self.model.parameters())) // 2
            params = list(self.model.parameters())
            return (torch.optim.SGD(params[:half], lr=0.1),
                    torch.optim.SGD(params[half:], lr=0.1))

    lm = TwoOpt()
    plugin = AmpPrecision("O2", loss_scale_manager=FixedLossScaleManager(2.0**12))
    trainer(plugin, max_epochs=1, limit_train_batches=5).fit(lm, loader())
    # the update for step k is applied when step k+1 begins, and at teardown
    assert lm.scales == [0, 1, 2, 3, 4]
    assert plugin.controller.steps == 5


def test_already_converted_modules_are_left_alone():
    lm = LM()
    auto_mixed_precision(lm.model, "O3", BF16)
    trainer(AmpPrecision("O2"), max_steps=1).fit(lm, loader())
    layers = {r["layer"]: r["w"] for r in lm.record if "layer" in r}
    assert layers[1] == BF16  # still O3: BatchNorm low


def test_auto_level_and_device_defaults():
    plugin = AmpPrecision("auto")
    trainer(plugin, max_steps=1).fit(LM(), loader())
    assert plugin.config.requested_level == "auto"
    assert plugin.config.level in ("O0", "O2") and plugin.config.device_type == "cpu"


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"level": "O9"}, ValueError, "must be one of"),
        ({"level": None}, TypeError, "must be a str"),
        ({"dtype": torch.float32}, ValueError, "'dtype' must be torch.float16"),
        ({"cast_model_type": torch.int8}, ValueError, "'cast_model_type' must be"),
        ({"keep_batchnorm_fp32": "no"}, TypeError, "'keep_batchnorm_fp32' must be a bool"),
        ({"white_list": [42]}, TypeError, "each element of 'white_list'"),
        ({"black_list": [torch.matmul]}, TypeError, "not supported in a black list"),
        ({"loss_scale_manager": 2.0}, TypeError, "'loss_scale_manager' must be None"),
    ],
)
def test_construction_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        AmpPrecision(**kwargs)


def test_fsdp_twin_is_accepted_by_fsdp_strategy_and_converts_alike():
    plugin = AmpFSDPPrecision("O2", dtype=BF16)
    strategy = FSDPStrategy(precision_plugin=plugin)
    assert strategy.precision_plugin is plugin
    assert plugin.mixed_precision_config is None and plugin.scaler is None
    assert not plugin.cache_casts
    with pytest.raises(TypeError):
        FSDPStrategy(precision_plugin=AmpPrecision("O2"))
    lm = LM()
    plugin.convert_module(lm)
    lm.model(torch.randn(4, 8))
    assert {r["layer"]: r["w"] for r in lm.record} == {0: BF16, 1: F32, 3: BF16, 4: F32, 5: BF16}
    assert plugin.state_dict() == {}


# --------------------------------------------------------------------------- DDP, 2 processes
class DDPLM(LM):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.out = out

    def on_train_end(self) -> None:
        flat = torch.cat([p.detach().flatten() for p in self.parameters()])
        gathered = self.all_gather(flat)
        low = [r["w"] == BF16 for r in self.record if "layer" in r]
        info = {
            "rank": self.global_rank,
            "same_params": bool(torch.equal(gathered[0], gathered[1])),
            "converted": bool(low) and any(low),
            "fp32_storage": all(p.dtype == F32 for p in self.parameters()),
            "scale": self.trainer.precision_plugin.loss_scale,
        }
        with open(os.path.join(self.out, f"rank{self.global_rank}.json"), "w") as f:
            json.dump(info, f)


@pytest.mark.slow
def test_ddp_two_cpu_processes(tmp_path):
    lm = DDPLM(str(tmp_path))
    plugin = AmpPrecision("O2", loss_scale_manager=DynamicLossScaleManager(2.0**8, 2, 2))
    tr = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_steps=4,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, plugins=[plugin])
    tr.fit(lm, loader(n=64))
    infos = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    for info in infos:
        assert info["same_params"] and info["converted"] and info["fp32_storage"], info
    assert infos[0]["scale"] == infos[1]["scale"] == 2.0**10  # grew twice, identically


# --------------------------------------------------------------------------- composition
def test_unknown_keyword_names_the_allowed_ones():
    with pytest.raises(TypeError, match=r"unknown keyword argument\(s\) \['keep_bn'\].*"
                                        r"keep_batchnorm_fp32.*overflow_diagnostics"):
        AmpPrecision("O2", keep_bn=True)
    with pytest.raises(TypeError, match="unknown keyword"):
        AmpFSDPPrecision("O2", keep_bn=True)


def test_injected_controller_is_used_as_is():
    ctl = LossScaleController(FixedLossScaleManager(2.0**12))
    plugin = AmpPrecision("O2", dtype=BF16, loss_scale=ctl)
    trainer(plugin, max_steps=2).fit(LM(), loader())
    assert plugin.controller is ctl and ctl.steps == 2 and plugin.loss_scale == 2.0**12


def test_loss_scale_manager_alias_and_conflict():
    manager = FixedLossScaleManager(2.0**5)
    plugin = AmpPrecision("O2", loss_scale_manager=manager)
    assert plugin.loss_scale_manager is manager
    with pytest.raises(TypeError, match="not both"):
        AmpPrecision("O2", loss_scale=manager, loss_scale_manager=manager)


def test_resolved_config_replaces_level_and_options():
    cfg = resolve_amp_config("O3", device="cpu", dtype=BF16)
    plugin = AmpPrecision(amp=cfg)
    assert plugin.config is cfg and plugin.level == "O3" and plugin.precision == "bf16-mixed"
    lm = LM()
    plugin.convert_module(lm)
    lm.model(torch.randn(4, 8))
    assert {r["layer"]: r["w"] for r in lm.record}[1] == BF16  # O3: BatchNorm low too
    with pytest.raises(ValueError, match="already fixes"):
        AmpPrecision(amp=cfg, keep_batchnorm_fp32=True)
    with pytest.raises(TypeError, match="'amp' must be an AmpConfig"):
        AmpPrecision(amp="O2")
