"""Cast kernels and lit_amp hook calls per training step, per AMP level (counts, not timings).

Counts what one bf16 training step of each demo network runs, after a warm-up step (the
weight casts of a cached conversion happen once per optimizer step and are counted): the
``aten._to_copy`` kernels (a dispatch-mode counter) and the calls of lit_amp's forward hooks,
at O1, O2, O3 and for the hand-written ``torch.autocast`` loop. Counts do not depend on the
machine's load, so this runs anywhere.

Usage::

    .venv/bin/python bench/amp_casts.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import write_result  # noqa: E402
from lit_amp.amp import forwards, hooks  # noqa: E402
from lit_amp.amp.convert import auto_mixed_precision  # noqa: E402
from lit_amp.amp.diagnostics import CastCounter  # noqa: E402
from lit_amp.demos.nets import CNN1D, ResNet1D  # noqa: E402

NETS = {"cnn": (CNN1D, (100, 40)), "resnet1d": (ResNet1D, (32, 40))}
VARIANTS = ("autocast", "O1", "O2", "O3")
#: The forwards a conversion installs instead of hooks (one Python call each per module call).
FORWARDS = ("autocast_forward", "low_root_forward", "low_forward", "island_forward",
            "fp32_forward")


def _counting(fn, calls: list):
    def call(*args, **kwargs):
        calls[0] += 1
        return fn(*args, **kwargs)
    return call


def count(make: type, shape: tuple[int, int], variant: str) -> dict[str, int]:
    """Casts, hook calls and replaced-forward calls of one training step (after a warm-up)."""
    torch.manual_seed(0)
    net = make()
    calls, wrapped = [0], [0]
    originals = {cls: cls.__call__ for cls in (hooks._AmpPreHook, hooks._AmpPostHook)}
    fwd = {name: getattr(forwards, name) for name in FORWARDS}
    try:
        for name, fn in fwd.items():  # before the conversion, which binds them
            setattr(forwards, name, _counting(fn, wrapped))
        if variant != "autocast":
            auto_mixed_precision(net, variant, torch.bfloat16)
        opt = torch.optim.SGD(net.parameters(), 0.01)
        x, y = torch.randn(*shape), torch.randint(0, 10, (shape[0],))

        def step() -> None:
            opt.zero_grad()
            with torch.autocast("cpu", torch.bfloat16, enabled=variant == "autocast"):
                out = net(x)
            nn.functional.cross_entropy(out.float(), y).backward()
            opt.step()

        step()
        wrapped[0] = 0
        for cls, original in originals.items():
            cls.__call__ = _counting(original, calls)
        with CastCounter() as counter:
            step()
    finally:
        for cls, original in originals.items():
            cls.__call__ = original
        for name, fn in fwd.items():
            setattr(forwards, name, fn)
    return {"casts": counter.count, "hook_calls": calls[0], "forward_calls": wrapped[0]}


def main() -> None:
    results = {name: {v: count(make, shape, v) for v in VARIANTS}
               for name, (make, shape) in NETS.items()}
    for name, row in results.items():
        print(name, " ".join(f"{v}: {c['casts']} casts / {c['hook_calls']} hooks / "
                             f"{c['forward_calls']} forwards" for v, c in row.items()))
    write_result("amp_casts", {"dtype": "bfloat16", "per_step": results})


if __name__ == "__main__":
    main()
