"""The contract every boost algorithm of :mod:`lit_amp.boost.registry` is held to.

Composer keeps one settings entry per algorithm (model, data, arguments) and runs every
registered algorithm through the same training and resumption tests; torchmetrics'
``MetricTester`` runs every metric through the same DDP and precision checks. This is the
same for boost: :func:`run` trains a ``LitModel`` on MNIST-1D-like data with one algorithm
switched on (manual mode, every other flag off) and returns a :class:`Run`;
``tests/boost/test_contract.py`` runs every registry entry through

(a) a short training run whose effect is observable (:attr:`Case.effect`, against the same
    run without boost),
(b) a checkpoint after epoch 1 (``lit_amp.save_checkpoint``, the AutoBoost state under
    ``"lit_amp_boost"``) loaded into a fresh model that trains epoch 2 exactly as the
    uninterrupted run did,
(c) 2-process DDP on CPU (gloo): ranks end identical (:attr:`Case.ddp_effect`),
(d) AMP levels O1 and O2: the effect still holds and the losses stay finite.

A registry entry without a :data:`CASES` entry gets :class:`Case`'s defaults (its section's
defaults, a tiny ResNet1D, "the weights differ from the run without boost"), so a new
algorithm is tested as soon as it is registered; add a case to assert what it should change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from lit_amp import LitModel
from lit_amp.boost.registry import ALGORITHMS
from lit_amp.demos import ResNet1D, synthetic_loaders
from lit_amp.serialization import BOOST_KEY, load_checkpoint, save_checkpoint

#: training batches per epoch (per rank under DDP) and their size
BATCHES, BATCH = 4, 16
EPOCHS = 2


@dataclass
class Run:
    """What a training run leaves behind (picklable: it comes back from DDP workers)."""

    losses: list[float]
    weights: torch.Tensor  # the network's parameters, flat, fp32
    steps: int  # optimizer steps (trainer.global_step)
    first_moved: list[bool]  # per batch: did the network's first parameter change?
    boost_state: dict | None  # AutoBoost.state_dict() at the end (None without boost)
    facts: dict = field(default_factory=dict)  # Case.observe's findings


def tiny_resnet() -> nn.Module:
    """Stem + 2 basic blocks with BatchNorm: LessBN has BNs to remove, GradientFreeze groups."""
    torch.manual_seed(0)
    return ResNet1D(channels=4, blocks=(1, 1))


def _ignore(*args: Any) -> dict:
    return {}


def differs_from_baseline(run: Run, base: Run) -> None:
    """The default effect: the algorithm changed what training produced."""
    assert all(np.isfinite(run.losses)), run.losses
    assert run.weights.shape != base.weights.shape or not torch.equal(run.weights, base.weights)


def ranks_agree(runs: list[Run], bases: list[Run]) -> None:
    """The default DDP effect: every rank ends with the same weights, unlike without DDP."""
    for r in runs[1:]:
        torch.testing.assert_close(r.weights, runs[0].weights, rtol=0, atol=0)


@dataclass(frozen=True)
class Case:
    """How to run one algorithm, and what it must change (composer's algorithm settings).

    Attributes:
        net: builds the (seeded) network.
        config: ``(net, tmp_dir) -> {section: settings}``, merged into the boost_config_dict.
        lit_kwargs: ``net -> extra LitModel keywords`` (also given to the baseline run).
        observe: ``(boost, lit, trainer) -> facts`` after fit (picklable values).
        effect: ``(run, baseline)``: asserts the algorithm's observable effect.
        ddp_effect: ``(runs per rank, baselines per rank)``: the same under DDP.
    """

    net: Callable[[], nn.Module] = tiny_resnet
    config: Callable[[nn.Module, Path], dict] = _ignore
    lit_kwargs: Callable[[nn.Module], dict] = _ignore
    observe: Callable[..., dict] = _ignore
    effect: Callable[[Run, Run], None] = differs_from_baseline
    ddp_effect: Callable[[list[Run], list[Run]], None] = ranks_agree


def case(name: str) -> Case:
    """The case of a registry entry (the defaults when it has none)."""
    return CASES.get(name, Case())


def boost_config(name: str, net: nn.Module, tmp: Path) -> dict:
    """``boost_config_dict`` with only ``name`` on, plus its case's settings."""
    flags = {a.name: a.name == name for a in ALGORITHMS}
    return {"boost": {"mode": "manual", **flags}, **case(name).config(net, tmp)}


def _data() -> DataLoader:
    train, _ = synthetic_loaders(num_train=BATCHES * BATCH * 2, num_valid=8, batch_size=BATCH)
    return DataLoader(train.dataset, batch_size=BATCH, shuffle=False)  # same order every epoch


class _Recorder(L.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.first_moved: list[bool] = []
        self._first: torch.Tensor | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._first = next(pl_module.network.parameters()).detach().clone()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss))
        now = next(pl_module.network.parameters()).detach()
        self.first_moved.append(not torch.equal(now, self._first))


def run(name: str | None, tmp: Path, *, amp: str = "O0", epochs: int = EPOCHS,
        ddp: bool = False, save_to: str | None = None, load_from: str | None = None,
        level: str | None = None, net_of: str | None = None) -> Run:
    """Train a LitModel with algorithm ``name`` on (None: without boost; ``level``: that
    boost level's table instead) and describe the run.

    Args:
        net_of: whose case builds the network and LitModel keywords (default ``name``; a
            baseline passes the algorithm it is the baseline of).
        save_to: save ``lit_amp.save_checkpoint(lit)`` there after fit.
        load_from: ``lit_amp.load_checkpoint(path, net=lit)`` before fit.
    """
    c = case(net_of or name or "")
    net = c.net()
    kw: dict[str, Any] = dict(c.lit_kwargs(net))
    if level is not None:
        kw.update(boost_level=level, boost_config_dict=_level_config(level, net, tmp))
    elif name is not None:
        kw.update(boost_level="O1", boost_config_dict=boost_config(name, net, tmp))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    lit = LitModel(net, nn.CrossEntropyLoss(), opt, metrics={"acc"}, amp_level=amp, **kw)
    if load_from is not None:
        state = load_checkpoint(load_from, net=lit)
        assert BOOST_KEY in state or lit.boost is None
    rec = _Recorder()
    trainer = L.Trainer(
        max_epochs=epochs, callbacks=[rec], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
        num_sanity_val_steps=0, **({"devices": 2, "strategy": "ddp"} if ddp else {}),
    )
    trainer.fit(lit, _data())
    if save_to is not None:
        save_checkpoint(lit, save_to)
    facts = {
        "find_unused": getattr(trainer.strategy, "_ddp_kwargs", {}).get("find_unused_parameters"),
        "algorithms": [a.name for a in lit.boost.algorithms] if lit.boost is not None else [],
    }
    if lit.boost is not None:
        facts.update(c.observe(lit.boost, lit, trainer))
    return Run(
        losses=rec.losses,
        weights=torch.cat([p.detach().float().reshape(-1) for p in net.parameters()]),
        steps=trainer.global_step,
        first_moved=rec.first_moved,
        boost_state=lit.boost.state_dict() if lit.boost is not None else None,
        facts=facts,
    )


def _level_config(level: str, net: nn.Module, tmp: Path) -> dict:
    """A boost level's table with the settings of its algorithms' cases."""
    cfg: dict = {}
    for a in ALGORITHMS:
        if level in a.levels:
            cfg.update(case(a.name).config(net, tmp))
    return cfg


def states_equal(a: Any, b: Any) -> bool:
    """Recursive equality of state dicts holding tensors."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b))
    return a == b


def baseline_key(name: str) -> tuple:
    """Algorithms whose cases build the same model share one baseline run."""
    c = case(name)
    return (c.net, c.lit_kwargs)


def ddp_worker(rank: int, world: int, tmp: str, names: list[str], levels: list[str]) -> dict:
    """One DDP launch for the whole contract: ``{name: Run}`` for every algorithm, its
    baseline (``"baseline:<name>"``) and every boost level (``"level:<level>"``)."""
    torch.set_num_threads(1)
    path = Path(tmp) / f"rank{rank}"
    path.mkdir(parents=True, exist_ok=True)
    out: dict[str, Run] = {}
    bases: dict[tuple, Run] = {}
    for name in names:
        key = baseline_key(name)
        if key not in bases:
            bases[key] = run(None, path, ddp=True, net_of=name)
        out[f"baseline:{name}"] = bases[key]
        out[name] = run(name, path, ddp=True)
    for level in levels:
        out[f"level:{level}"] = run(None, path, ddp=True, level=level)
    return out


# ------------------------------------------------------------------ the cases
def _less_bn_observe(boost: Any, lit: LitModel, trainer: L.Trainer) -> dict:
    head = lit.network.fc
    return {"removed_bn": list(boost.get_algorithm("less_bn").removed_bn),
            "head": type(head).__name__, "multiplier": float(head.multiplier.detach())}


def _less_bn_effect(run: Run, base: Run) -> None:
    differs_from_baseline(run, base)
    assert run.facts["removed_bn"] == ["layers.0.bn1", "layers.1.bn1"]  # inner BNs of blocks
    assert run.facts["head"] == "CommonHeadLastFN"
    assert run.facts["multiplier"] != 1.0  # the normalized head's scale trains
    assert run.weights.numel() < base.weights.numel()  # 2 BNs and the head's bias left


def _grad_freeze_observe(boost: Any, lit: LitModel, trainer: L.Trainer) -> dict:
    return {"position": boost.get_algorithm("grad_freeze").position}


def _grad_freeze_effect(run: Run, base: Run) -> None:
    differs_from_baseline(run, base)
    assert run.facts["position"] == run.steps  # one schedule position per optimizer step
    # some steps froze the first layer (a prefix), some trained it; without boost all did
    assert any(run.first_moved) and not all(run.first_moved), run.first_moved
    assert all(base.first_moved)


def _grad_freeze_ddp(runs: list[Run], bases: list[Run]) -> None:
    ranks_agree(runs, bases)
    # frozen parameters get no gradient: DDP was switched to find_unused_parameters
    assert all(r.facts["find_unused"] is True for r in runs)
    assert len({r.facts["position"] for r in runs}) == 1


def _adasum_observe(boost: Any, lit: LitModel, trainer: L.Trainer) -> dict:
    algo = boost.get_algorithm("adasum")
    stats = [b for n, b in lit.network.named_buffers() if n.endswith(("running_mean", "_var"))]
    return {"steps": algo.steps, "transport": algo.transport_used,
            "bn": torch.cat([b.detach().float().reshape(-1) for b in stats])}


def _adasum_effect(run: Run, base: Run) -> None:
    # one process: nothing to combine, training is exactly the baseline's
    assert torch.equal(run.weights, base.weights)
    assert run.facts["steps"] == 0 and run.facts["transport"] is None


def _adasum_ddp(runs: list[Run], bases: list[Run]) -> None:
    from lit_amp.boost.adasum.shm import shm_supported

    ranks_agree(runs, bases)
    # DDP's sync was off: each rank stepped on its own gradients, the deltas were combined by
    # AdaSum (not averaged), and BatchNorm statistics averaged in AdaSum's own exchange
    assert not torch.equal(runs[0].weights, bases[0].weights)
    assert all(torch.equal(r.facts["bn"], runs[0].facts["bn"]) for r in runs)
    assert all(r.facts["steps"] == r.steps > 0 for r in runs)
    expected = "shm" if shm_supported()[0] else "process_group"
    assert all(r.facts["transport"] == expected for r in runs)
    assert all(r.facts["find_unused"] is not True for r in runs)


def _accumulation_effect(run: Run, base: Run) -> None:
    differs_from_baseline(run, base)
    assert run.steps * 2 == base.steps  # one optimizer step per window of 2 batches
    assert run.first_moved == [False, True] * (len(run.first_moved) // 2)


def _accumulation_ddp(runs: list[Run], bases: list[Run]) -> None:
    ranks_agree(runs, bases)
    assert all(r.steps * 2 == b.steps for r, b in zip(runs, bases))


def _pca_config(net: nn.Module, tmp: Path) -> dict:
    n = sum(p.numel() for p in net.parameters() if p.requires_grad)
    g = torch.Generator().manual_seed(0)
    pca = torch.linalg.qr(torch.randn(n, 3, generator=g))[0].t().contiguous()
    path = tmp / f"pca_{n}.npy"
    if not path.exists():
        np.save(path, pca.numpy())
    return {"dim_reduce": {"pca_mat_path": str(path), "n_components": 3, "alpha": 0.05}}


def _dim_reduce_observe(boost: Any, lit: LitModel, trainer: L.Trainer) -> dict:
    return {"optimizer": type(trainer.optimizers[0]).__name__,
            "last_rho": boost.get_algorithm("dim_reduce").optimizer.last_rho}


def _dim_reduce_effect(run: Run, base: Run) -> None:
    differs_from_baseline(run, base)
    assert run.facts["optimizer"] == "DimReduceOptimizer"  # the optimizer was replaced
    assert run.facts["last_rho"] in (1.0, 0.55, 0.55**2)  # a line-search step was taken


class _GroupScaledNet(nn.Module):
    """An MLP with GroupLossScaleManager markers: group 1 = fc1, group 2 = fc2."""

    def __init__(self) -> None:
        from lit_amp.boost.group_loss_scale import GroupLossScaleManager

        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(40, 16), nn.Linear(16, 10)
        self.scales = GroupLossScaleManager(2.0**10, [])
        self.scales.loss_scale_groups = [list(self.fc1.parameters()),
                                         list(self.fc2.parameters())]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.scales
        return m(self.fc2(m(torch.tanh(self.fc1(m(x, 0, 1))), 1, 2)), 2, 3)


def _group_scaled_kwargs(net: nn.Module) -> dict:
    return {"loss_scale_manager": net.scales}


def _group_observe(boost: Any, lit: LitModel, trainer: L.Trainer) -> dict:
    return {"loss_scales": lit.amp_kwargs["loss_scale_manager"].loss_scales}


def _group_effect(run: Run, base: Run) -> None:
    # the flag only checks that the manager is a GroupLossScaleManager; the manager scales
    # each group: every finite step grew both groups' scales by 2^(1/1000)
    assert torch.equal(run.weights, base.weights)
    expected = 2.0**10 * 2.0 ** (run.steps / 1000)
    assert np.allclose(run.facts["loss_scales"], [expected, expected], rtol=1e-5)


#: per algorithm: how to run it and what it must change (registry entries without one get
#: Case()'s defaults)
CASES: dict[str, Case] = {
    "less_bn": Case(observe=_less_bn_observe, effect=_less_bn_effect),
    "grad_freeze": Case(
        config=lambda net, tmp: {"grad_freeze": {"param_groups": 4, "freeze_p": 0.5}},
        observe=_grad_freeze_observe, effect=_grad_freeze_effect, ddp_effect=_grad_freeze_ddp,
    ),
    "adasum": Case(observe=_adasum_observe, effect=_adasum_effect, ddp_effect=_adasum_ddp),
    "grad_accumulation": Case(
        config=lambda net, tmp: {"grad_accumulation": {"grad_accumulation_step": 2}},
        effect=_accumulation_effect, ddp_effect=_accumulation_ddp,
    ),
    "dim_reduce": Case(config=_pca_config, observe=_dim_reduce_observe,
                       effect=_dim_reduce_effect),
    "loss_scale_group": Case(net=_GroupScaledNet, lit_kwargs=_group_scaled_kwargs,
                             observe=_group_observe, effect=_group_effect),
}
