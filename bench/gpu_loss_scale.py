"""GPU benchmark (c), issue #24: the cost of dynamic loss scaling at O2 float16.

Workload: the transformer of ``gpu_amp.py`` (4 ``nn.TransformerEncoderLayer`` blocks, d_model
512, 8 heads, seq 256, batch 64: the GPU is busy), SGD(momentum=0.9), cross-entropy, the same
pre-generated batches on the device and the same initial weights for every variant:

====================================  =========================================================
lit_amp O2 fp16, dynamic scale        ``Model(..., amp_level="O2", loss_scale_manager=
                                      DynamicLossScaleManager(2**10, 2, scale_window=10**6))``
                                      (float16 is Model's CUDA default)
lit_amp O2 fp16, no scaling           ``loss_scale_manager=None``: the controller is disabled,
                                      so no scaling, unscaling, overflow check or update at all
                                      (``FixedLossScaleManager(1, drop_overflow_update=False)``
                                      would still multiply by 1 and unscale)
hand autocast fp16 + GradScaler       ``torch.amp.GradScaler(init_scale=2**10,
                                      growth_interval=10**6)`` (reference)
hand autocast fp16, no scaler         reference baseline
====================================  =========================================================

The scale is small and its window long, so no step overflows and the scale never changes
while timed (the skipped steps and final scales are recorded to show it).

Target: steps/s(no scaling) / steps/s(dynamic) <= 1.02 for lit_amp (median of per-round
ratios); the torch pair is reported alongside for reference.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _gpu  # noqa: E402
from lit_amp import DynamicLossScaleManager, Model  # noqa: E402

FP16 = torch.float16
WARM = 3
INIT_SCALE = 2.0**10
WINDOW = 10**6
DYN, NONE = "lit_amp O2 fp16, dynamic scale", "lit_amp O2 fp16, no scaling"
HSCALER, HNONE = "hand autocast fp16 + GradScaler", "hand autocast fp16, no scaler"


def build(wl: dict, batches: list, device: torch.device) -> tuple[dict, dict, dict]:
    runners, how, info = {}, {}, {}

    def model_run(manager):
        net = _gpu.seeded(wl["make"], device)
        model = Model(net, nn.CrossEntropyLoss(), _gpu.sgd(net), amp_level="O2",
                      loss_scale_manager=manager,
                      trainer={"accelerator": _gpu.trainer_flags(device)["accelerator"],
                               "devices": 1})

        def report():
            lit = model.lit_model
            ctl, cfg = lit.loss_scale, lit.amp_config
            return {"dtype": str(cfg.dtype) if cfg is not None else None,
                    "loss_scaling_enabled": bool(ctl is not None and ctl.enabled),
                    "skipped_steps": getattr(ctl, "skipped_steps", None),
                    "final_scale": float(ctl.scale) if ctl is not None and ctl.enabled else None}
        return _gpu.model_runner(model, batches, device, WARM), report

    runners[DYN], info[DYN] = model_run(DynamicLossScaleManager(INIT_SCALE, 2, WINDOW))
    how[DYN] = (f"Model(..., amp_level='O2', loss_scale_manager=DynamicLossScaleManager("
                f"{INIT_SCALE:g}, 2, {WINDOW}))")
    runners[NONE], info[NONE] = model_run(None)
    how[NONE] = "Model(..., amp_level='O2', loss_scale_manager=None)"

    ce = nn.CrossEntropyLoss()
    dev = device.type

    def hand(scaled):
        net = _gpu.seeded(wl["make"], device)
        opt = _gpu.sgd(net)
        scaler = (torch.amp.GradScaler(dev, init_scale=INIT_SCALE, growth_interval=WINDOW)
                  if scaled else None)
        step = _gpu.autocast_step(net, opt, batches, ce, dev, FP16, scaler)

        def report():
            return {"final_scale": float(scaler.get_scale()) if scaler is not None else None}
        return _gpu.hand_runner(step, device, WARM), report

    runners[HSCALER], info[HSCALER] = hand(True)
    how[HSCALER] = (f"torch.autocast(float16) + torch.amp.GradScaler(init_scale={INIT_SCALE:g}, "
                    f"growth_interval={WINDOW})")
    runners[HNONE], info[HNONE] = hand(False)
    how[HNONE] = "torch.autocast(float16), plain backward and step"
    return runners, how, info


def main() -> None:
    args, budget, device, m = _gpu.start("gpu_loss_scale", __doc__, 30)
    wl = _gpu.workload("transformer", args.dry_run)
    batches = _gpu.make_batches(wl, device)
    runners, how, info = build(wl, batches, device)
    res = _gpu.measure(runners, budget, budget.left() - 2.0, dry_run=args.dry_run, min_rounds=3,
                  dry_rounds=2, rounds_goal=9)
    # steps/s without scaling over steps/s with it = time with scaling / time without
    cost = {"lit_amp": _gpu.paired_ratio(res, NONE, DYN),
            "torch": _gpu.paired_ratio(res, HNONE, HSCALER)}
    resolved = {n: f() for n, f in info.items()}
    targets = [_gpu.target("lit_amp O2 fp16: time with dynamic scaling / without", cost["lit_amp"],
                      "<=", 1.02)]
    r = {"title": wl["title"], "config": wl["config"], "how": how, "resolved": resolved, **res,
         "time_ratio_scaled_to_unscaled": cost}
    payload = {"machine": m, "dry_run": args.dry_run, "budget_s": args.budget_s,
               "elapsed_s": budget.elapsed(), "results": r, "targets": targets,
               "all_targets_met": all(t["met"] for t in targets)}
    md = [_gpu.headline("gpu_loss_scale: dynamic loss scaling overhead, O2 fp16", m), ""]
    if args.dry_run:
        md += ["Dry run: tiny sizes on the CPU; Model's O2 runs in its CPU default (bf16) there. "
               "The numbers mean nothing.", ""]
    md += [f"**{wl['title']}**, median of {res['rounds']} interleaved rounds, "
           f"{budget.elapsed():.0f} s in all.", "",
           "| variant | steps/s | skipped steps | final scale |", "|---|---:|---:|---:|"]
    for n, v in res["median_steps_per_s"].items():
        rr = resolved.get(n, {})
        skipped, scale = rr.get("skipped_steps"), rr.get("final_scale")
        md.append(f"| {n} | {v:.2f} | {'' if skipped is None else skipped} | "
                  f"{'' if scale is None else f'{scale:g}'} |")
    md += [f"| {n} | failed: {e} | | |" for n, e in res["errors"].items()]
    md += ["", f"Time ratio with/without scaling: lit_amp {_gpu.fmt(cost['lit_amp'])}, torch "
           f"GradScaler {_gpu.fmt(cost['torch'])} (reference).", "", *_gpu.md_targets(targets)]
    jp, mp = _gpu.write_results("loss_scale", args.out, payload, md)
    print("\n".join(md))
    print("written:", jp, mp)


if __name__ == "__main__":
    main()
