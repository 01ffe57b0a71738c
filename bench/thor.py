"""Benchmark: THOR vs SGD-momentum vs Adam vs a reference K-FAC on MNIST-1D (issue #5).

Protocol of ``../shared/reference/thor_boost_anchors.md`` §4.4, on the 2 shared CPU cores:

- Tasks: MNIST-1D (4000 train / 1000 test, generated offline, full data as in-memory tensors),
  batch 100 (40 steps per epoch). MLP: 40-100-100-10 with the residual hidden block of the
  MNIST-1D paper (``h + relu(W2 h)``), target 65% test accuracy. CNN:
  :class:`lit_amp.nets.CNN1D` (the paper's ConvBase), target 90%.
- Optimizers (hyper-parameters from ``--tune``, per model, on seeds 100-101, never on the
  reported seeds): Adam and SGD-momentum with the paper recipe (constant lr; 100 MLP / 40 CNN
  epochs, 5x and 2x the second-order budget, so that they reach the targets); THOR and the
  reference K-FAC with a 20-epoch budget and MindSpore's THOR schedules rescaled to it
  (``get_thor_lr`` power 2 for both; ``get_thor_damping`` decay 0.5 per 10 epochs for THOR,
  K-FAC keeps kfac-pytorch's constant damping).
- Reference K-FAC: kfac-pytorch 0.4.2's documented defaults, reimplemented here (kfac-pytorch
  is not installable offline): factors every step (EMA decay 0.95, initialised to identity,
  bias folded into A), eigendecomposition every 10 steps, damping 0.003, KL-clip 0.001, then
  SGD-momentum. Label: "K-FAC (kfac-pytorch defaults, reimplemented)". Conv1d is handled as a
  1×k Conv2d (kfac-pytorch registers Linear and Conv2d only).
- Metrics: test accuracy every 20 steps (half an epoch; finer than the protocol's 100), epochs
  and train wall time to the target (``perf_counter`` around the training step only;
  evaluation and the first 50 steps excluded), final and best accuracy, factor
  inversions/eigendecompositions (noise-free), divergence (non-finite loss or final accuracy
  < 20%).
- Statistics: 5 seeds (0-4), medians and IQR; the variants of each seed run back to back in a
  rotating order so background load hits them alike; ``torch.set_num_threads(2)`` with
  ``OMP_WAIT_POLICY=PASSIVE`` (spinning OpenMP threads made 2-thread runs ~25x slower than
  1-thread runs while the cores were shared). A separate
  interleaved timing pass (``bench/_common.interleaved``: 300 steps per variant, 5 repeats)
  gives noise-robust ms/step ratios; "derived" times to target are median epochs to target ×
  that per-step time.

Run: ``.venv/bin/python bench/thor.py`` (about 10 minutes on 2 idle cores), ``--quick`` for a
smoke run, ``--tune`` for the hyper-parameter grids. Writes ``bench/results/thor.json`` (or
``thor_tuning.json``) and the THOR section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Measured here under load: with the default active OpenMP wait policy, 2 threads on 2 busy
# cores ran ~25x slower than 1 thread (threads spin waiting for descheduled peers); passive
# waiting removes that. Must be set before torch starts its OpenMP runtime.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DOC, interleaved, machine, write_result  # noqa: E402

from lit_amp.datasets import mnist1d_arrays  # noqa: E402
from lit_amp.nets import CNN1D  # noqa: E402
from lit_amp.optim.thor import (  # noqa: E402
    DEFAULT_FACTOR_DECAY,
    THOR,
    get_thor_damping,
    get_thor_lr,
)
from lit_amp.optim.thor.factors import conv_patches  # noqa: E402

SPE = 40  # steps per epoch (4000 samples, batch 100)
BATCH = 100
EVAL_EVERY = 20
WARMUP_STEPS = 50
TARGET = {"mlp": 0.65, "cnn": 0.90}
SEEDS = [0, 1, 2, 3, 4]
TUNE_SEEDS = [100, 101]
BUDGET = {  # epochs
    ("mlp", "first"): 100,
    ("cnn", "first"): 40,
    ("mlp", "second"): 20,
    ("cnn", "second"): 20,
}

# Chosen by `--tune` (bench/results/thor_tuning.json); see the tuning section of the report.
TUNED: dict[str, dict[str, dict[str, Any]]] = {
    "mlp": {
        "adam": {"lr": 1e-2},
        "sgd": {"lr": 0.1},
        "kfac": {"lr": 0.02, "weight_decay": 0.0},
        "thor": {"lr": 0.05, "weight_decay": 0.02, "damping": 0.03},
    },
    "cnn": {
        "adam": {"lr": 3e-2},
        "sgd": {"lr": 0.1},
        "kfac": {"lr": 0.005, "weight_decay": 0.02},
        "thor": {"lr": 0.02, "weight_decay": 0.02, "damping": 0.03},
    },
}
# THOR's recipe: statistics every 10 steps (K-FAC's inverse cadence) and the trace rule with
# omega1 = 0.1 skipping most re-inversions (>= 5x fewer than K-FAC). On the tuning seeds
# omega1 = 0.05 and 0.1 gave the same accuracy (MLP 0.655 / 0.654, CNN 0.945 / 0.944 median)
# with ~1.7x fewer inversions for 0.1. Other settings are the optimizer's defaults
# (factor_decay 0.5, split_dim 128). factor_decay: a second tuning grid (seeds 100-102; beta
# {0, 0.5, 0.7, 0.9} x lr x weight decay, MLP) ended highest at beta 0.5 with the tuned lr/wd
# (median final 0.671 vs 0.649 for 0.9; beta 0 diverged at lr 0.08), so the default moved there.
THOR_MAIN: dict[str, Any] = {"frequency": 10, "trace_thresholds": (0.1, 0.0)}


# ----------------------------------------------------------------------------- data & nets
class ResMLP(nn.Module):
    """MNIST-1D paper MLP: 40 -> 100 -> (h + relu(W h)) -> 10."""

    def __init__(self, hidden: int = 100) -> None:
        super().__init__()
        self.l1 = nn.Linear(40, hidden)
        self.l2 = nn.Linear(hidden, hidden)
        self.l3 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.l1(x))
        h = h + torch.relu(self.l2(h))
        return self.l3(h)


def make_net(model: str) -> nn.Module:
    return ResMLP() if model == "mlp" else CNN1D()


_DATA: dict[str, torch.Tensor] = {}


def data() -> dict[str, torch.Tensor]:
    if not _DATA:
        d = mnist1d_arrays()
        _DATA["x"] = torch.as_tensor(d["x"], dtype=torch.float32)
        _DATA["y"] = torch.as_tensor(d["y"], dtype=torch.long)
        _DATA["xt"] = torch.as_tensor(d["x_test"], dtype=torch.float32)
        _DATA["yt"] = torch.as_tensor(d["y_test"], dtype=torch.long)
    return _DATA


# ----------------------------------------------------------------------------- K-FAC reference
class RefKFAC:
    """K-FAC preconditioner with kfac-pytorch 0.4.2's default semantics (reimplemented).

    ``loss.backward(); kfac.step(); optimizer.step()``: factors in the module hooks every
    ``factor_update_steps`` steps (running average, decay 0.95, identity initialisation, bias
    column in A, G from the mean-loss output gradients), eigendecompositions every
    ``inv_update_steps`` steps, ``v = Q_G [(Q_Gᵀ g Q_A) / (d_G d_Aᵀ + damping)] Q_Aᵀ``, and the
    KL-clip rescaling ``min(1, sqrt(kl_clip / |Σ v·g·lr²|))``.
    """

    def __init__(
        self,
        model: nn.Module,
        lr: Callable[[], float],
        factor_decay: float = 0.95,
        damping: float = 0.003,
        inv_update_steps: int = 10,
        factor_update_steps: int = 1,
        kl_clip: float = 0.001,
    ) -> None:
        self.lr, self.decay, self.damping = lr, factor_decay, damping
        self.inv_every, self.factor_every = inv_update_steps, factor_update_steps
        self.kl_clip = kl_clip
        self.steps = 0
        self.eigendecompositions = 0
        self.layers: list[dict[str, Any]] = []
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
                st: dict[str, Any] = {"m": m, "A": None, "G": None}
                self.layers.append(st)
                m.register_forward_pre_hook(self._save_input(st))
                m.register_full_backward_hook(self._save_grad(st))

    def _ema(self, old: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
        if old is None:
            old = torch.eye(new.shape[0], dtype=new.dtype)
        return self.decay * old + (1 - self.decay) * new

    def _save_input(self, st: dict[str, Any]) -> Callable:
        def hook(m: nn.Module, inputs: tuple) -> None:
            if not m.training or self.steps % self.factor_every:
                return
            with torch.no_grad():
                x = inputs[0].detach()
                if isinstance(m, nn.Linear):
                    a = x.reshape(-1, x.shape[-1])
                    a = torch.cat([a, a.new_ones(a.shape[0], 1)], 1)
                else:
                    spatial = _out_positions(m, x)
                    a = conv_patches(m, x)
                    a = torch.cat([a, a.new_ones(a.shape[0], 1)], 1) / spatial
                cov = a.t() @ (a / a.shape[0])
                st["A"] = self._ema(st["A"], (cov + cov.t()) / 2)

        return hook

    def _save_grad(self, st: dict[str, Any]) -> Callable:
        def hook(m: nn.Module, grad_in: tuple, grad_out: tuple) -> None:
            if not m.training or self.steps % self.factor_every:
                return
            with torch.no_grad():
                g = grad_out[0].detach()
                if isinstance(m, nn.Linear):
                    g = g.reshape(-1, g.shape[-1])
                else:
                    spatial = math.prod(g.shape[2:])
                    g = g.movedim(1, -1).reshape(-1, g.shape[1]) / spatial
                cov = g.t() @ (g / g.shape[0])
                st["G"] = self._ema(st["G"], (cov + cov.t()) / 2)

        return hook

    @torch.no_grad()
    def step(self) -> None:
        if self.steps % self.inv_every == 0:
            for st in self.layers:
                st["dA"], st["qA"] = torch.linalg.eigh(st["A"])
                st["dG"], st["qG"] = torch.linalg.eigh(st["G"])
                st["dA"].clamp_(min=0.0)
                st["dG"].clamp_(min=0.0)
                self.eigendecompositions += 2
        vg = 0.0
        lr = self.lr()
        grads = []
        for st in self.layers:
            m = st["m"]
            w = m.weight.grad.reshape(m.weight.shape[0], -1)
            g = torch.cat([w, m.bias.grad.reshape(-1, 1)], 1) if m.bias is not None else w
            v1 = st["qG"].t() @ g @ st["qA"]
            v = st["qG"] @ (v1 / (torch.outer(st["dG"], st["dA"]) + self.damping)) @ st["qA"].t()
            vg += float((v * g).sum()) * lr * lr
            grads.append(v)
        scale = 1.0 if vg == 0 else min(1.0, math.sqrt(self.kl_clip / abs(vg)))
        for st, v in zip(self.layers, grads):
            m = st["m"]
            nw = m.weight.shape[0]
            if m.bias is not None:
                m.weight.grad.copy_((v[:, :-1] * scale).reshape(m.weight.shape))
                m.bias.grad.copy_(v[:, -1] * scale)
            else:
                m.weight.grad.copy_((v * scale).reshape(nw, *m.weight.shape[1:]))
        self.steps += 1


def _out_positions(m: nn.Module, x: torch.Tensor) -> int:
    conv: Any = m
    length = x.shape[-1] + sum(conv._reversed_padding_repeated_twice[:2])
    k = conv.dilation[-1] * (conv.kernel_size[-1] - 1) + 1
    n = (length - k) // conv.stride[-1] + 1
    if isinstance(m, nn.Conv2d):
        h = x.shape[-2] + sum(conv._reversed_padding_repeated_twice[2:])
        kh = conv.dilation[0] * (conv.kernel_size[0] - 1) + 1
        n *= (h - kh) // conv.stride[0] + 1
    return n


# ----------------------------------------------------------------------------- optimizers
def _poly(lr0: float, epochs: int) -> Callable[[int], float]:
    sched = get_thor_lr(0, lr0, 2.0, epochs, SPE)
    values = sched.tolist()
    return lambda k: values[min(k, len(values) - 1)]


def build(variant: str, net: nn.Module, epochs: int, opts: dict[str, Any]) -> tuple[Any, Any]:
    """(optimizer, preconditioner or None) for a variant name ("thor", "thor:freq=1", ...)."""
    base, _, extra = variant.partition(":")
    if base == "adam":
        return torch.optim.Adam(net.parameters(), lr=opts["lr"]), None
    if base == "sgd":
        return torch.optim.SGD(net.parameters(), lr=opts["lr"], momentum=0.9), None
    if base == "kfac":
        sched = _poly(opts["lr"], epochs)
        opt = torch.optim.SGD(
            net.parameters(), lr=sched(0), momentum=0.9, weight_decay=opts["weight_decay"]
        )
        pre = RefKFAC(net, lr=lambda: opt.param_groups[0]["lr"])
        opt._poly = sched  # type: ignore[attr-defined]
        return opt, pre
    assert base == "thor", variant
    kw: dict[str, Any] = dict(THOR_MAIN)
    for item in filter(None, extra.split(",")):
        key, _, val = item.partition("=")
        if key == "freq":
            kw["frequency"] = int(val)
        elif key == "w":
            w1, w2 = val.split("/")
            kw["trace_thresholds"] = (float(w1), float(w2))
        elif key == "split":
            kw["split_dim"] = None if val == "full" else int(val)
        elif key == "beta":
            kw["factor_decay"] = float(val)
        elif key == "wd":
            opts = {**opts, "weight_decay": float(val)}
        elif key == "lr":
            opts = {**opts, "lr": float(val)}
        else:
            raise ValueError(f"unknown THOR variant option {item!r} in {variant!r}")
    lr = get_thor_lr(0, opts["lr"], 2.0, epochs, SPE)
    damping = get_thor_damping(0, opts["damping"], 0.5, epochs, SPE)
    opt = THOR(net, lr, damping, 0.9, weight_decay=opts["weight_decay"], **kw)
    return opt, None


def _counter(opt: Any, pre: Any) -> int:
    if isinstance(opt, THOR):
        return opt.inversions
    if pre is not None:
        return pre.eigendecompositions
    return 0


# ----------------------------------------------------------------------------- one run
def train(model: str, variant: str, seed: int, epochs: int, opts: dict[str, Any]) -> dict:
    """Train one (model, variant, seed); returns the metrics of the run."""
    torch.manual_seed(seed)
    d = data()
    net = make_net(model)
    opt, pre = build(variant, net, epochs, opts)
    sched = getattr(opt, "_poly", None)
    gen = torch.Generator().manual_seed(seed)
    x_all, y_all, xt, yt = d["x"], d["y"], d["xt"], d["yt"]
    target = TARGET[model]
    step, t_train, hit_epoch, hit_time = 0, 0.0, None, None
    accs: list[float] = []
    loss_v = 0.0
    diverged = False
    for _ in range(epochs):
        perm = torch.randperm(x_all.shape[0], generator=gen)
        for i in range(SPE):
            idx = perm[i * BATCH : (i + 1) * BATCH]
            xb, yb = x_all[idx], y_all[idx]
            t0 = time.perf_counter()
            if sched is not None:
                opt.param_groups[0]["lr"] = sched(step)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(xb), yb)
            loss.backward()
            if pre is not None:
                pre.step()
            opt.step()
            dt = time.perf_counter() - t0
            step += 1
            if step > WARMUP_STEPS:
                t_train += dt
            if step % EVAL_EVERY == 0:
                loss_v = float(loss.detach())
                if not math.isfinite(loss_v):
                    diverged = True
                    break
                net.eval()
                with torch.no_grad():
                    acc = float((net(xt).argmax(1) == yt).float().mean())
                net.train()
                accs.append(acc)
                if hit_epoch is None and acc >= target:
                    hit_epoch, hit_time = step / SPE, t_train
        if diverged:
            break
    final = accs[-1] if accs and not diverged else 0.0
    diverged = diverged or final < 0.2
    return {
        "model": model,
        "variant": variant,
        "seed": seed,
        "epochs": epochs,
        "steps": step,
        "final_acc": final,
        "best_acc": max(accs) if accs else 0.0,
        "epochs_to_target": hit_epoch,
        "time_to_target_s": hit_time,
        "train_time_s": t_train,
        "inversions": _counter(opt, pre),
        "refreshes": getattr(opt, "refreshes", None),
        "diverged": diverged,
        "final_loss": loss_v,
        "acc_curve": accs,
    }


def _budget(model: str, variant: str, quick: bool) -> int:
    kind = "second" if variant.split(":")[0] in ("thor", "kfac") else "first"
    e = BUDGET[(model, kind)]
    return max(2, e // 10) if quick else e


def _opts(model: str, variant: str) -> dict[str, Any]:
    return dict(TUNED[model][variant.split(":")[0]])


def run_set(
    models: list[str],
    variants: list[str],
    seeds: list[int],
    quick: bool,
    opts_for: Callable[[str, str], dict[str, Any]] = _opts,
) -> list[dict]:
    """Every (model, seed) with its variants back to back in a rotating order."""
    out = []
    for model in models:
        for si, seed in enumerate(seeds):
            order = variants[si % len(variants) :] + variants[: si % len(variants)]
            for v in order:
                r = train(model, v, seed, _budget(model, v, quick), opts_for(model, v))
                out.append(r)
                print(
                    f"  {model} {v:24s} seed {seed}: final {r['final_acc']:.3f} best "
                    f"{r['best_acc']:.3f} target@{r['epochs_to_target']} ep "
                    f"t={r['train_time_s']:.1f}s inv={r['inversions']}",
                    flush=True,
                )
    return out


# ----------------------------------------------------------------------------- timing pass
def timing_pass(models: list[str], variants: list[str], steps: int, repeats: int) -> dict:
    """Median ms/step per (model, variant) from interleaved short runs (warm-up excluded)."""
    d = data()
    result: dict[str, dict[str, float]] = {}
    for model in models:
        fns = {}
        for v in variants:

            def fn(v: str = v, model: str = model) -> None:
                torch.manual_seed(0)
                net = make_net(model)
                opt, pre = build(v, net, 20, _opts(model, v))
                x, y = d["x"][:BATCH], d["y"][:BATCH]
                for _ in range(steps):
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(net(x), y).backward()
                    if pre is not None:
                        pre.step()
                    opt.step()

            fns[v] = fn
        times = interleaved(fns, repeats=repeats, warmup=1)
        result[model] = {v: 1000 * statistics.median(t) / steps for v, t in times.items()}
        result[model + "_raw_s"] = times  # type: ignore[assignment]
    return result


# ----------------------------------------------------------------------------- summaries
def _med(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _quantile(xs: list[float], p: float) -> float:
    """Inclusive-method quantile of sorted ``xs`` that tolerates inf (never-reached runs)."""
    pos = (len(xs) - 1) * p
    lo, frac = int(pos), pos - int(pos)
    if frac == 0 or xs[lo] == xs[lo + 1]:
        return xs[lo]
    if math.isinf(xs[lo + 1]):
        return float("inf")
    return xs[lo] + frac * (xs[lo + 1] - xs[lo])


def _iqr(xs: list[float]) -> list[float] | None:
    xs = sorted(x for x in xs if x is not None)
    if len(xs) < 2:
        return None
    return [_quantile(xs, 0.25), _quantile(xs, 0.75)]


def summarize(runs: list[dict]) -> dict:
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["model"], r["variant"]), []).append(r)
    out = {}
    for (model, v), rs in groups.items():
        inf = float("inf")
        e2t = [r["epochs_to_target"] if r["epochs_to_target"] is not None else inf for r in rs]
        t2t = [r["time_to_target_s"] if r["time_to_target_s"] is not None else inf for r in rs]
        out[f"{model}/{v}"] = {
            "model": model,
            "variant": v,
            "seeds": [r["seed"] for r in rs],
            "budget_epochs": rs[0]["epochs"],
            "final_acc_median": _med([r["final_acc"] for r in rs]),
            "final_acc_iqr": _iqr([r["final_acc"] for r in rs]),
            "best_acc_median": _med([r["best_acc"] for r in rs]),
            "epochs_to_target_median": statistics.median(e2t),
            "epochs_to_target_iqr": _iqr(e2t),
            "reached_target": sum(r["epochs_to_target"] is not None for r in rs),
            "time_to_target_s_median": statistics.median(t2t),
            "train_time_s_median": _med([r["train_time_s"] for r in rs]),
            "inversions_median": _med([r["inversions"] for r in rs]),
            "diverged": sum(r["diverged"] for r in rs),
        }
    return out


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isinf(x):
            return "never"
        return f"{x:.{nd}f}"
    return str(x)


def targets(summary: dict, timing: dict) -> dict:
    """Evaluate the issue's targets from the summaries."""
    s = summary
    t: dict[str, Any] = {}
    th, ad, kf = s["mlp/thor"], s["mlp/adam"], s["mlp/kfac"]
    t["mlp_epochs_to_65_le_20"] = {
        "value": th["epochs_to_target_median"],
        "met": th["epochs_to_target_median"] <= 20,
    }
    t_th, t_ad = th["time_to_target_s_median"], ad["time_to_target_s_median"]
    if math.isinf(t_th):
        ratio = float("inf")
    elif math.isinf(t_ad):
        ratio = 0.0  # Adam never reached the target within its (10x longer) budget
    else:
        ratio = t_th / t_ad
    ms = timing.get("mlp", {})
    derived = None
    if ms and math.isfinite(ad["epochs_to_target_median"]):
        derived = (th["epochs_to_target_median"] * ms["thor"]) / (
            ad["epochs_to_target_median"] * ms["adam"]
        )
    t["mlp_time_to_65_le_0.5x_adam"] = {
        "value_measured": ratio,
        "value_derived": derived,
        "met": ratio <= 0.5,
        "note": "adam never reached the target: ratio is 0 by definition"
        if math.isinf(ad["time_to_target_s_median"])
        else "",
    }
    t["mlp_final_ge_66"] = {"value": th["final_acc_median"], "met": th["final_acc_median"] >= 0.66}
    cn = s["cnn/thor"]
    t["cnn_epochs_to_90_le_10"] = {
        "value": cn["epochs_to_target_median"],
        "met": cn["epochs_to_target_median"] <= 10,
    }
    for model in ("mlp", "cnn"):
        a, b = s[f"{model}/thor"], s[f"{model}/kfac"]
        t[f"{model}_final_within_1pt_of_kfac"] = {
            "value": a["final_acc_median"] - b["final_acc_median"],
            "met": abs(a["final_acc_median"] - b["final_acc_median"]) <= 0.01
            or a["final_acc_median"] >= b["final_acc_median"],
        }
        inv_ratio = b["inversions_median"] / max(a["inversions_median"], 1)
        t[f"{model}_inversions_ge_5x_fewer_than_kfac"] = {"value": inv_ratio, "met": inv_ratio >= 5}
        wall = a["train_time_s_median"] / b["train_time_s_median"]
        ms_m = timing.get(model, {})
        t[f"{model}_wall_le_0.8x_kfac"] = {
            "value_measured": wall,
            "value_ms_per_step": ms_m["thor"] / ms_m["kfac"] if ms_m else None,
            "met": wall <= 0.8,
        }
        t[f"{model}_no_divergence"] = {"value": a["diverged"], "met": a["diverged"] == 0}
    del kf
    return t


def table(summary: dict, keys: list[str]) -> str:
    head = (
        "| model / optimizer | budget (ep) | epochs to target (median [IQR]) | reached | "
        "time to target (s) | final acc (median [IQR]) | best acc | inversions | diverged |"
    )
    lines = [head, "|" + "---|" * 9]
    for k in keys:
        r = summary[k]
        iqr = r["epochs_to_target_iqr"]
        fiqr = r["final_acc_iqr"]
        lines.append(
            f"| {k} | {r['budget_epochs']} | {_fmt(r['epochs_to_target_median'], 1)}"
            f"{' [' + _fmt(iqr[0], 1) + ', ' + _fmt(iqr[1], 1) + ']' if iqr else ''} | "
            f"{r['reached_target']}/{len(r['seeds'])} | {_fmt(r['time_to_target_s_median'], 2)} | "
            f"{_fmt(r['final_acc_median'])}"
            f"{' [' + _fmt(fiqr[0]) + ', ' + _fmt(fiqr[1]) + ']' if fiqr else ''} | "
            f"{_fmt(r['best_acc_median'])} | {_fmt(r['inversions_median'], 0)} | "
            f"{r['diverged']} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- tuning
def _grid(lrs: tuple[float, ...], wds: tuple[float, ...], **extra: Any) -> list[dict[str, Any]]:
    return [{"lr": v, "weight_decay": w, **extra} for v in lrs for w in wds]


TUNE_GRID: dict[str, dict[str, list[dict[str, Any]]]] = {
    "mlp": {
        "adam": [{"lr": v} for v in (3e-3, 1e-2, 3e-2)],
        "sgd": [{"lr": v} for v in (0.03, 0.1, 0.3)],
        "kfac": _grid((0.02, 0.05, 0.1), (0.0, 0.02)),
        "thor": _grid((0.03, 0.05, 0.08), (0.01, 0.02), damping=0.03),
    },
    "cnn": {
        "adam": [{"lr": v} for v in (3e-3, 1e-2, 3e-2)],
        "sgd": [{"lr": v} for v in (0.03, 0.1, 0.3)],
        "kfac": _grid((0.005, 0.01, 0.02), (0.0, 0.02)),
        "thor": _grid((0.01, 0.02, 0.05), (0.01, 0.02), damping=0.03),
    },
}


DECAY_SEEDS = [100, 101, 102]


def tune_decay() -> dict:
    """MLP grid over factor_decay x trace threshold x lr x weight decay (seeds 100-102): how
    the default ``factor_decay`` was chosen (highest median final accuracy)."""
    import itertools

    grid = [
        *itertools.product((0.0, 0.5, 0.9), ("0.1/0", "0.05/0"), (0.05, 0.08), (0.02, 0.05)),
        *itertools.product((0.5, 0.7), ("0.1/0",), (0.04, 0.05, 0.065), (0.0, 0.01, 0.02)),
    ]
    rows = []
    for beta, w, lr, wd in dict.fromkeys(grid):
        variant = f"thor:beta={beta},w={w}"
        opts = {**TUNED["mlp"]["thor"], "lr": lr, "weight_decay": wd}
        rs = [train("mlp", variant, s, BUDGET[("mlp", "second")], opts) for s in DECAY_SEEDS]
        row = {
            "variant": variant,
            "opts": opts,
            "final_acc_median": statistics.median(r["final_acc"] for r in rs),
            "final_acc": [r["final_acc"] for r in rs],
            "epochs_to_target": [r["epochs_to_target"] for r in rs],
            "inversions_median": statistics.median(r["inversions"] for r in rs),
        }
        rows.append(row)
        print(f"  {variant:26s} lr={lr} wd={wd}: final {row['final_acc_median']:.3f} "
              f"epochs to target {row['epochs_to_target']}", flush=True)
    return {"seeds": DECAY_SEEDS, "grid": rows, **decay_summary(rows)}


def decay_summary(rows: list[dict]) -> dict:
    """Per factor_decay, the mean over the cells every beta ran (first grid) of the median final
    accuracy (a diverged run counts 0): robust to the ~1-2 point seed/thread noise of single
    cells, and it penalises instability at larger learning rates."""
    def beta(r: dict) -> float:
        return float(r["variant"].split("beta=")[1].split(",")[0])

    def cell(r: dict) -> tuple:
        return (r["variant"].split(",")[1], r["opts"]["lr"], r["opts"]["weight_decay"])

    betas = [0.0, 0.5, 0.9]  # the betas of the full first grid (0.7 ran a finer lr/wd grid only)
    common = set.intersection(*({cell(r) for r in rows if beta(r) == b} for b in betas))
    by_beta = {
        str(b): statistics.mean(r["final_acc_median"] for r in rows
                                if beta(r) == b and cell(r) in common)
        for b in betas
    }
    return {"mean_final_over_common_cells": by_beta,
            "common_cells": len(common),
            "best_factor_decay": float(max(by_beta, key=by_beta.get))}


def tune(models: list[str], quick: bool) -> dict:
    """Small grids per model on seeds 100-101 (never reported); returns grid and choices."""
    out: dict[str, Any] = {}
    for model in models:
        out[model] = _tune_model(model, quick)
    return out


def _tune_model(model: str, quick: bool) -> dict:
    results = {}
    for base, grid in TUNE_GRID[model].items():
        for i, opts in enumerate(grid):
            name = f"{base}#{i}"
            runs = run_set([model], [base], TUNE_SEEDS, quick, opts_for=lambda m, v, o=opts: o)
            summ = summarize(runs)[f"{model}/{base}"]
            results[name] = {"opts": opts, **summ}
    best = {}
    for base in TUNE_GRID[model]:
        cands = [(k, r) for k, r in results.items() if k.startswith(base + "#")]
        k, r = min(
            cands,
            key=lambda kr: (
                -kr[1]["reached_target"],
                kr[1]["epochs_to_target_median"],
                -kr[1]["final_acc_median"],
            ),
        )
        best[base] = r["opts"]
    return {"grid": results, "chosen": best, "seeds": TUNE_SEEDS}


# ----------------------------------------------------------------------------- report
MAIN = ["sgd", "adam", "kfac", "thor"]
ABLATIONS = [
    "thor:freq=1",
    "thor:freq=50",
    "thor:freq=200",
    "thor:w=0/0",
    "thor:w=0.01/0",
    "thor:w=0.01/0.001",
    "thor:w=0.05/0",
    "thor:split=32",
    "thor:split=full",
    "thor:beta=0",
    "thor:beta=0.9",
    "thor:beta=0,w=0/0",
]


def write_doc(payload: dict) -> None:
    m = payload["machine"]
    s = payload["summary"]
    t = payload["targets"]
    tm = payload["timing_ms_per_step"]
    lines = [
        "<!-- thor:begin -->",
        "## THOR vs SGD / Adam / K-FAC on MNIST-1D (`bench/thor.py`, issue #5)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, "
        f"{m['threads']} threads; {payload['date']}. Seeds {payload['seeds']}, medians "
        "[IQR]. Budgets: THOR and K-FAC 20 epochs (their schedules end there), Adam/SGD 100 "
        "(MLP) / 40 (CNN) epochs at the paper's constant lr. Command: "
        "`.venv/bin/python bench/thor.py`.",
        "",
        table(s, [f"{mm}/{v}" for mm in ("mlp", "cnn") for v in MAIN]),
        "",
        "Per-step cost (interleaved timing pass, median ms/step, ratio to SGD):",
        "",
        "| model | " + " | ".join(MAIN) + " |",
        "|---|" + "---|" * len(MAIN),
    ]
    for mm in ("mlp", "cnn"):
        row = tm.get(mm, {})
        if row:
            lines.append(
                f"| {mm} | "
                + " | ".join(f"{row[v]:.2f} ({row[v] / row['sgd']:.2f}x)" for v in MAIN)
                + " |"
            )
    lines += ["", "Targets:", "", "| target | value | met |", "|---|---|---|"]
    for k, v in t.items():
        val = {kk: vv for kk, vv in v.items() if kk != "met"}
        val_s = ", ".join(
            f"{kk}={_fmt(vv) if not isinstance(vv, str) else vv}"
            for kk, vv in val.items()
            if vv not in ("", None)
        )
        lines.append(f"| {k} | {val_s} | {'yes' if v['met'] else '**no**'} |")
    if payload.get("ablations"):
        lines += [
            "",
            "THOR ablations (MLP, 20 epochs, one change each from the THOR row: frequency 10, "
            f"trace_thresholds (0.1, 0), factor_decay {DEFAULT_FACTOR_DECAY}, split_dim 128 — "
            "equal to 'full' "
            "here, every factor is at most 100 wide; `beta=0,w=0/0` is MindSpore's released "
            "algorithm):",
            "",
            table(s, ["mlp/thor", *[f"mlp/{v}" for v in ABLATIONS if f"mlp/{v}" in s]]),
        ]
    lines += [
        "",
        "Reading the ablations: `split=full` is numerically the same algorithm as the THOR row "
        "here (identity padding of the Cholesky blocks is the only difference), so the spread "
        "between those two rows is the seed-to-seed noise floor of a 20-epoch run (about 1 "
        "point of final accuracy, one seed crossing the target or not). The ablations ran in a "
        "later phase under a different background load: compare their times with each other "
        "only, not with the main table. Raw runs, IQRs and the "
        "timing repeats are in `bench/results/thor.json`; the tuning grids (seeds 100-101) in "
        "`bench/results/thor_tuning.json`.",
        "",
        "The default `factor_decay` (0.5) comes from `bench/thor.py --tune-decay` (MLP, seeds "
        "100-102, never reported): over the same 8 cells (trace threshold 0.1 / 0.05 x lr "
        "0.05 / 0.08 x weight decay 0.02 / 0.05) the mean median final accuracy was 0.650 for "
        "beta 0.5, 0.636 for 0.9 and 0.337 for 0 (single-batch factors diverged in 4 of the 8 "
        "cells); `bench/results/thor_decay_tuning.json`. With 0.9 (the previous default, "
        "ablation row `beta=0.9`) the MLP ended at 0.650, below the 0.66 target. Single cells "
        "move by 1-2 points with the seed or the thread count, which is why the choice "
        "averages over cells. The trace rule ablation `w=0.05/0` ending higher than the recipe "
        "(0.1/0) on these reported seeds was not used to change the recipe.",
        "",
        "<!-- thor:end -->",
        "",
    ]
    section = "\n".join(lines)
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    if "<!-- thor:begin -->" in text:
        pre, _, rest = text.partition("<!-- thor:begin -->")
        _, _, post = rest.partition("<!-- thor:end -->")
        text = pre + section.rstrip("\n") + post
    else:
        text = text.rstrip("\n") + "\n\n" + section
    DOC.write_text(text)


def _report_only() -> None:
    import json

    from _common import RESULTS

    old = json.loads((RESULTS / "thor.json").read_text())
    timing = {**old["timing_ms_per_step"], **old["timing_raw_s"]}
    summary = summarize(old["runs"])
    payload = {k: v for k, v in old.items() if k != "benchmark"}
    payload["summary"] = summary
    payload["targets"] = targets(summary, timing)
    path = write_result("thor", payload)
    write_doc(payload)
    print(table(summary, list(summary)))
    print(f"-> {path} (re-summarized from the recorded runs)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny budgets (smoke run)")
    ap.add_argument("--tune", action="store_true", help="run the hyper-parameter grids")
    ap.add_argument("--tune-models", default="mlp,cnn", help="models to tune (comma list)")
    ap.add_argument("--tune-decay", action="store_true",
                    help="the factor_decay grid (MLP, seeds 100-102) behind the default")
    ap.add_argument("--seeds", type=int, default=len(SEEDS))
    ap.add_argument("--no-ablations", action="store_true")
    ap.add_argument("--timing-repeats", type=int, default=5)
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="recompute the summary, targets and docs section from bench/results/thor.json",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore", message=".*Full backward hook is firing.*")
    data()
    t0 = time.time()
    if args.tune:
        import json

        from _common import RESULTS

        old_path = RESULTS / "thor_tuning.json"
        old = json.loads(old_path.read_text()) if old_path.exists() else {}
        models = args.tune_models.split(",")
        res = {k: v for k, v in old.items() if k in TUNE_GRID}
        res.update(tune(models, args.quick))
        res["seeds"] = TUNE_SEEDS
        res["rule"] = "most seeds reaching the target, then fewest epochs to it, then final acc"
        path = write_result("thor_tuning", res)
        print("chosen:", {m: res[m]["chosen"] for m in TUNE_GRID if m in res}, "->", path)
        return
    if args.tune_decay:
        res = tune_decay()
        print("mean final per factor_decay:", res["mean_final_over_common_cells"], "best:",
              res["best_factor_decay"], "->", write_result("thor_decay_tuning", res))
        return
    if args.report_only:
        _report_only()
        return
    seeds = SEEDS[: args.seeds]
    print("main comparison", flush=True)
    runs = run_set(["mlp", "cnn"], MAIN, seeds, args.quick)
    if not args.no_ablations:
        print("ablations", flush=True)
        runs += run_set(["mlp"], ABLATIONS, seeds, args.quick)
    print("timing pass", flush=True)
    steps = 30 if args.quick else 300
    timing = timing_pass(["mlp", "cnn"], MAIN, steps, 2 if args.quick else args.timing_repeats)
    summary = summarize(runs)
    tg = targets(summary, timing)
    payload = {
        "protocol": "thor_boost_anchors.md §4.4; see bench/thor.py docstring",
        "seeds": seeds,
        "budgets_epochs": {f"{k[0]}/{k[1]}-order": v for k, v in BUDGET.items()},
        "hyperparameters": TUNED,
        "thor_recipe": THOR_MAIN,
        "timing_ms_per_step": {k: v for k, v in timing.items() if not k.endswith("_raw_s")},
        "timing_raw_s": {k: v for k, v in timing.items() if k.endswith("_raw_s")},
        "summary": summary,
        "targets": tg,
        "ablations": not args.no_ablations,
        "runs": runs,
        "total_time_s": time.time() - t0,
        "quick": args.quick,
    }
    name = "thor_quick" if args.quick else "thor"
    path = write_result(name, payload)
    payload = {**payload, "machine": machine(), "date": time.strftime("%Y-%m-%d")}
    print(table(summary, list(summary)))
    for k, v in tg.items():
        print(f"{k}: {v}")
    print(f"-> {path} ({time.time() - t0:.0f} s)")
    if not args.quick:
        write_doc(payload)


if __name__ == "__main__":
    main()
