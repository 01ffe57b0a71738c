"""GPU benchmark (a), issue #24: training steps/s of lit_amp's AMP levels against PyTorch/Lightning.

Two workloads, each on the same pre-generated batches stored on the device, SGD(momentum=0.9),
cross-entropy:

- ``resnet18``: ResNet-18 for 3x32x32 images (10 classes), batch 256;
- ``transformer``: 4 ``nn.TransformerEncoderLayer`` blocks (d_model 512, 8 heads, ff 2048,
  pre-norm), 256 synthetic tokens, batch 64, mean-pooled 10-class head.

Variants (every one from the same initial weights):

==================================  ============================================================
fp32 hand loop                      plain PyTorch loop, float32
lit_amp O0 (Model)                  ``Model(net, loss, opt, amp_level="O0", trainer={gpu, 1})``
fp16 hand autocast+GradScaler       ``torch.autocast(fp16)`` + ``torch.amp.GradScaler``
fp16 Lightning 16-mixed             plain LightningModule, ``Trainer(precision="16-mixed")``
fp16 lit_amp O1/O2/O3 (Model)       ``Model(..., amp_level=level)``: float16 is Model's CUDA
                                    default (O2 with its default DynamicLossScaleManager)
fp16 model.half() hand loop         pure float16 weights and inputs: the ceiling
bf16 hand autocast                  ``torch.autocast(bf16)``, no scaler
bf16 Lightning bf16-mixed           plain LightningModule, ``Trainer(precision="bf16-mixed")``
bf16 lit_amp O1/O2/O3 (AmpPrecision)  ``Model`` takes no dtype: ``LitModel(net, loss, opt)`` in
                                    ``Trainer(plugins=[AmpPrecision(level, dtype=bf16)])``
bf16 lit_amp auto (Model)           ``Model(..., amp_level="auto")``: O2 bfloat16 on a GPU with
                                    bfloat16 (the resolved level/dtype is recorded)
==================================  ============================================================

Each variant is timed over many steps between two device synchronisations (warm-up steps and
calls excluded), the variants interleaved in rotating order, the median of the rounds
reported. Ratios are medians of per-round ratios to the hand autocast loop of each dtype.
Targets: lit_amp O2 >= 1.0x the hand autocast loop and >= Lightning's mixed precision of the
same dtype.

    python bench/gpu_amp.py [--budget-s 90] [--out DIR]     # on a CUDA machine
    python bench/gpu_amp.py --dry-run --out /tmp/x          # tiny, on the CPU
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _gpu  # noqa: E402
from lit_amp import Model  # noqa: E402
from lit_amp.model.lit_model import LitModel  # noqa: E402
from lit_amp.plugins.precision import AmpPrecision  # noqa: E402

FP16, BF16 = torch.float16, torch.bfloat16
WARM = 3  # warm-up steps (hand loops) / batches (Lightning fits) inside every timed call
HAND = {"fp16": "fp16 hand autocast+GradScaler", "bf16": "bf16 hand autocast"}


class PlainModule(pl.LightningModule):
    """What a Lightning user writes: automatic optimization, the loss in training_step."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.loss_fn = nn.CrossEntropyLoss()
        self._opt = _gpu.sgd(net)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.loss_fn(self.net(x), y)

    def configure_optimizers(self):
        return self._opt


def _amp_info(cfg) -> dict | None:
    if cfg is None:
        return None
    lsm = cfg.loss_scale_manager
    return {"level": cfg.level, "mechanism": cfg.mechanism, "dtype": str(cfg.dtype),
            "loss_scale_manager": type(lsm).__name__ if lsm is not None else None}


def build(wl: dict, batches: list, device: torch.device, dry: bool):
    """The runners, how each is built, and callables that report what lit_amp resolved."""
    ce = nn.CrossEntropyLoss()
    k = len(batches)
    dev_type = device.type
    runners, how, info = {}, {}, {}

    def plain_step(net, opt):
        def step(i):
            x, y = batches[i % k]
            opt.zero_grad(set_to_none=True)
            ce(net(x), y).backward()
            opt.step()
        return step

    net = _gpu.seeded(wl["make"], device)
    runners["fp32 hand loop"] = _gpu.hand_runner(plain_step(net, _gpu.sgd(net)), device, WARM)
    how["fp32 hand loop"] = "plain PyTorch loop in float32 (TF32 flags as recorded)"

    def autocast_runner(dtype, scaled):
        net = _gpu.seeded(wl["make"], device)
        opt = _gpu.sgd(net)
        scaler = torch.amp.GradScaler(dev_type) if scaled else None
        step = _gpu.autocast_step(net, opt, batches, ce, dev_type, dtype, scaler)
        return _gpu.hand_runner(step, device, WARM)

    runners[HAND["fp16"]] = autocast_runner(FP16, True)
    how[HAND["fp16"]] = "torch.autocast(float16) forward+loss, torch.amp.GradScaler()"
    runners[HAND["bf16"]] = autocast_runner(BF16, False)
    how[HAND["bf16"]] = "torch.autocast(bfloat16) forward+loss, no scaler"

    half = _gpu.seeded(wl["make"], device).half()
    hopt = _gpu.sgd(half)
    hbatches = [(x.half() if x.is_floating_point() else x, y) for x, y in batches]

    def half_step(i):
        x, y = hbatches[i % k]
        hopt.zero_grad(set_to_none=True)
        ce(half(x).float(), y).backward()
        hopt.step()

    runners["fp16 model.half() hand loop"] = _gpu.hand_runner(half_step, device, WARM)
    how["fp16 model.half() hand loop"] = ("model.half(), float16 inputs, SGD on float16 "
                                          "weights: the ceiling")

    def fit_runner(module, trainer_kw):
        def run(n):
            timer = _gpu.StepTimer(WARM, device, last=WARM + n)
            trainer = pl.Trainer(max_epochs=1, callbacks=[timer], **_gpu.trainer_flags(device),
                                 **trainer_kw())
            with _gpu.lightning_quiet():
                trainer.fit(module, _gpu.loader(_gpu.cycled(batches, WARM + n)))
            return timer.result()
        return run

    for dt, prec in (("fp16", "16-mixed"), ("bf16", "bf16-mixed")):
        real = prec if not (dry and prec == "16-mixed") else "bf16-mixed"  # no fp16 AMP on CPU
        name = f"{dt} Lightning {prec}"
        runners[name] = fit_runner(PlainModule(_gpu.seeded(wl["make"], device)),
                                   lambda real=real: {"precision": real})
        how[name] = f"plain LightningModule (automatic optimization), Trainer(precision={real!r})"

    def model_run(level):
        net = _gpu.seeded(wl["make"], device)
        acc = _gpu.trainer_flags(device)["accelerator"]
        model = Model(net, nn.CrossEntropyLoss(), _gpu.sgd(net), amp_level=level,
                      trainer={"accelerator": acc, "devices": 1})

        def report():
            lit = model.lit_model
            ctl = lit.loss_scale
            return {"amp": _amp_info(lit.amp_config),
                    "skipped_steps": getattr(ctl, "skipped_steps", None),
                    "loss_scale": float(ctl.scale) if ctl is not None and ctl.enabled else None}
        return _gpu.model_runner(model, batches, device, WARM), report

    for level in ("O0", "O1", "O2", "O3"):
        name = "lit_amp O0 (Model)" if level == "O0" else f"fp16 lit_amp {level} (Model)"
        runners[name], info[name] = model_run(level)
        how[name] = (f"Model(net, CrossEntropyLoss(), SGD, amp_level={level!r}, "
                     "trainer={accelerator, devices: 1}); dtype: Model's default (float16 on "
                     "CUDA)")

    def ampprec_run(level, dtype):
        net = _gpu.seeded(wl["make"], device)
        lit = LitModel(net, nn.CrossEntropyLoss(), _gpu.sgd(net))
        lit.log_train_loss = False  # as Model sets it without logger/progress bar
        plugins: list = []

        def kw():
            plugins[:] = [AmpPrecision(level, dtype=dtype, log_loss_scale=False)]
            return {"plugins": list(plugins)}

        def report():
            return {"amp": _amp_info(plugins[0].config) if plugins else None}
        return fit_runner(lit, kw), report

    for level in ("O1", "O2", "O3"):
        name = f"bf16 lit_amp {level} (AmpPrecision)"
        runners[name], info[name] = ampprec_run(level, BF16)
        how[name] = (f"LitModel(net, CrossEntropyLoss(), SGD) (log_train_loss=False, as Model) "
                     f"in Trainer(plugins=[AmpPrecision({level!r}, dtype=torch.bfloat16, "
                     "log_loss_scale=False)])")
    name = "bf16 lit_amp auto (Model)"
    runners[name], info[name] = model_run("auto")
    how[name] = "Model(..., amp_level='auto'): O2 bfloat16 where the GPU has bf16 (see 'resolved')"
    return runners, how, info


def dtype_of(name: str) -> str:
    return name.split()[0] if name.split()[0] in ("fp16", "bf16") else "fp32"


def run_workload(key: str, device: torch.device, budget: _gpu.Budget, share: float,
                 dry: bool) -> dict:
    wl = _gpu.workload(key, dry)
    print(f"{key}: {wl['title']}  (share {share:.0f} s)", flush=True)
    batches = _gpu.make_batches(wl, device)
    runners, how, info = build(wl, batches, device, dry)
    res = _gpu.measure(runners, budget, share, dry_run=dry, min_rounds=3, dry_rounds=2)
    names = list(res["median_steps_per_s"])
    ratios = {h: {n: _gpu.paired_ratio(res, n, HAND[h]) for n in names} for h in HAND}
    resolved = {n: f() for n, f in info.items()}
    targets = []
    pairs = [("fp16", "fp16 lit_amp O2 (Model)", "fp16 Lightning 16-mixed"),
             ("bf16", "bf16 lit_amp O2 (AmpPrecision)", "bf16 Lightning bf16-mixed"),
             ("bf16", "bf16 lit_amp auto (Model)", "bf16 Lightning bf16-mixed")]
    for dt, ours, theirs in pairs:
        if ours.endswith("auto (Model)"):
            amp = (resolved.get(ours) or {}).get("amp") or {}
            if not (amp.get("level") == "O2" and amp.get("dtype") == str(BF16)):
                continue  # auto did not resolve to O2 bf16 (no bf16 GPU, or a dry run)
        targets.append(_gpu.target(f"{key}: {ours} / {HAND[dt]}", ratios[dt][ours], ">=", 1.0))
        targets.append(_gpu.target(f"{key}: {ours} / {theirs}",
                                   _gpu.paired_ratio(res, ours, theirs), ">=", 1.0))
    del runners, batches
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"title": wl["title"], "config": wl["config"], "how": how, "resolved": resolved,
            **res, "ratio_to_hand_autocast": ratios, "targets": targets}


def markdown(m: dict, results: dict, dry: bool, budget: _gpu.Budget) -> list[str]:
    lines = [_gpu.headline("gpu_amp: AMP levels, training steps/s", m), ""]
    if dry:
        lines += ["Dry run: tiny sizes on the CPU; fp16 Lightning uses bf16-mixed and Model "
                  "its CPU default (bf16). The numbers mean nothing.", ""]
    lines += [f"Median of interleaved rounds (warm-up excluded), ratios = median per-round ratio "
              f"to the hand autocast loop of each dtype; {budget.elapsed():.0f} s in all.", ""]
    for r in results.values():
        lines += [f"**{r['title']}** ({r['rounds']} rounds)", "",
                  "| variant | steps/s | vs hand fp16 autocast | vs hand bf16 autocast |",
                  "|---|---:|---:|---:|"]
        for n, v in r["median_steps_per_s"].items():
            lines.append(f"| {n} | {v:.1f} | {_gpu.fmt(r['ratio_to_hand_autocast']['fp16'][n])} | "
                         f"{_gpu.fmt(r['ratio_to_hand_autocast']['bf16'][n])} |")
        lines += [f"| {n} | failed: {e} | | |" for n, e in r["errors"].items()]
        lines.append("")
    all_t = [t for r in results.values() for t in r["targets"]]
    lines += ["Targets: lit_amp O2 >= 1.0x the hand autocast loop and >= Lightning's mixed "
              "precision of the same dtype (bf16 lit_amp through AmpPrecision: Model takes no "
              "dtype; 'auto' is Model's bf16 O2 on CUDA).", "", *_gpu.md_targets(all_t)]
    return lines


def main() -> None:
    args, budget, device, m = _gpu.start("gpu_amp", __doc__, 90)
    results = {}
    keys = ["resnet18", "transformer"]
    for i, key in enumerate(keys):
        share = (budget.left() - 2.0) / (len(keys) - i)
        results[key] = run_workload(key, device, budget, max(share, 5.0), args.dry_run)
    targets = [t for r in results.values() for t in r["targets"]]
    payload = {"machine": m, "dry_run": args.dry_run, "budget_s": args.budget_s,
               "elapsed_s": budget.elapsed(), "results": results, "targets": targets,
               "all_targets_met": all(t["met"] for t in targets)}
    md = markdown(m, results, args.dry_run, budget)
    jp, mp = _gpu.write_results("amp", args.out, payload, md)
    print("\n".join(markdown(m, results, args.dry_run, budget)))
    print("written:", jp, mp)


if __name__ == "__main__":
    main()
