"""Shared pieces of the GPU benchmarks (``bench/gpu_amp.py``, ``gpu_host_bound.py``,
``gpu_loss_scale.py``, issue #24).

- the command line every script takes (``--budget-s``, ``--dry-run``, ``--out``) and the
  refusal to run for real without CUDA;
- the machine description (device, driver, torch/CUDA/cuDNN/Lightning versions);
- timing: every variant is a *runner* ``run(n) -> (seconds, steps)`` that times about ``n``
  training steps after its own warm-up steps, between two device synchronisations (hand loops
  time the loop; Lightning fits time from the first post-warm-up batch to ``on_train_end`` with
  :class:`StepTimer`); :func:`measure` calls every runner once as warm-up (which also calibrates
  its step time and per-call overhead), sizes the steps per measurement to the time budget, then
  runs rounds in rotating order until the budget is spent (at least ``min_rounds``);
- the result writers (``gpu_<name>.json`` and ``gpu_<name>.md``);
- the nets: a CIFAR ResNet-18, a transformer-encoder classifier, the MNIST-1D MLP, and synthetic
  batches generated once on the device.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from bench._common import QUIET_TRAINER, RESULTS, Target, cpu_model, fmt, targets_table  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
NO_CUDA = "needs a CUDA device; use --dry-run on CPU"

#: a runner times about ``n`` steps after its own warm-up; returns (seconds, steps timed)
Runner = Callable[[int], "tuple[float, int]"]


# ----------------------------------------------------------------------------- clock
def _process_age() -> float:
    """Seconds since this process started (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


class Budget:
    """The script's time budget, counted from the start of the process (imports included)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        self._t0 = time.perf_counter() - _process_age()

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def left(self) -> float:
        return self.seconds - self.elapsed()


# ----------------------------------------------------------------------------- command line
def default_out() -> Path:
    for var in ("GPU_OUT", "OUT"):
        if os.environ.get(var):
            return Path(os.environ[var])
    return RESULTS


def parse_args(doc: str, budget_s: float) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=budget_s,
                    help=f"wall-clock budget of the whole script, imports included "
                    f"(default {budget_s:g})")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny sizes on the CPU: checks every code path and the result files")
    ap.add_argument("--out", type=Path, default=None,
                    help="result folder (default: $GPU_OUT, else $OUT, else bench/results)")
    args = ap.parse_args()
    if args.out is None:
        args.out = default_out()
    return args


def pick_device(dry_run: bool) -> torch.device:
    """CPU for a dry run; otherwise CUDA, or exit 2 with :data:`NO_CUDA`."""
    if dry_run:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        print(f"{Path(sys.argv[0]).name}: {NO_CUDA}", file=sys.stderr)
        raise SystemExit(2)
    torch.backends.cudnn.benchmark = True  # conv algorithms tuned in the warm-up calls
    return torch.device("cuda")


def quiet() -> None:
    """Lightning's banners and hints off (errors still show)."""
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric", "lightning", "lit_amp"):
        logging.getLogger(name).setLevel(logging.ERROR)


# ----------------------------------------------------------------------------- machine
def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def _version(mod: str) -> str | None:
    try:
        return __import__(mod).__version__
    except Exception:  # noqa: BLE001 - a missing package is simply not recorded
        return None


def machine_info(device: torch.device) -> dict:
    """Everything that decides the numbers: device, driver, versions, CPU, math flags."""
    cpu = cpu_model()
    info: dict[str, Any] = {
        "device": str(device),
        "device_name": f"CPU ({cpu})",
        "driver": None,
        "nvidia_smi": _run(["nvidia-smi", "--query-gpu=name,driver_version",
                            "--format=csv,noheader"]),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "lightning": _version("lightning"),
        "torchmetrics": _version("torchmetrics"),
        "lit_amp_commit": _run(["git", "rev-parse", "--short", "HEAD"]),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["device_name"] = torch.cuda.get_device_name(device)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        info["memory_gib"] = round(props.total_memory / 2**30, 1)
        info["bf16_supported"] = torch.cuda.is_bf16_supported()
        smi = info["nvidia_smi"]
        if smi:
            info["driver"] = smi.splitlines()[0].rsplit(",", 1)[-1].strip()
    return info


def headline(name: str, m: dict) -> str:
    """The markdown file's first line: the benchmark and the device it ran on."""
    if m["device"].startswith("cuda"):
        return (f"# {name} on {m['device_name']} (driver {m['driver']}, torch {m['torch']}, "
                f"CUDA {m['cuda']}, Lightning {m['lightning']})")
    return f"# {name} on {m['device_name']} (DRY RUN, tiny sizes; torch {m['torch']})"


# ----------------------------------------------------------------------------- timing
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def start(name: str, doc: str, budget_s: float) -> tuple:
    """A benchmark's opening: its arguments, budget, device and machine description (printed).

    Returns ``(args, budget, device, machine)``.
    """
    args = parse_args(doc, budget_s)
    budget = Budget(args.budget_s)
    device = pick_device(args.dry_run)
    quiet()
    m = machine_info(device)
    print(headline(name, m), flush=True)
    return args, budget, device, m


def hand_runner(step: Callable[[int], None], device: torch.device, warm: int = 3) -> Runner:
    """A runner of a hand-written loop: ``step(i)`` trains on batch ``i``."""

    def run(n: int) -> tuple[float, int]:
        for i in range(warm):
            step(i)
        sync(device)
        t0 = time.perf_counter()
        for i in range(n):
            step(i)
        sync(device)
        return time.perf_counter() - t0, n

    return run


def autocast_step(net: nn.Module, opt: torch.optim.Optimizer, batches: list, loss_fn: Callable,
                  device_type: str, dtype: torch.dtype,
                  scaler: torch.amp.GradScaler | None = None) -> Callable[[int], None]:
    """``step(i)``: a hand-written step on batch ``i`` with the forward and the loss under
    ``torch.autocast(dtype)``, the loss scaled by ``scaler`` when there is one."""

    def step(i: int) -> None:
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=dtype):
            loss = loss_fn(net(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    return step


def model_runner(model: Any, batches: list, device: torch.device, warm: int = 3) -> Runner:
    """A runner of ``lit_amp.Model.train``: one epoch over ``warm + n`` batches, timed by
    :class:`StepTimer` from batch ``warm`` to the last."""

    def run(n: int) -> tuple[float, int]:
        timer = StepTimer(warm, device, last=warm + n)
        model.train(1, loader(cycled(batches, warm + n)), callbacks=[timer])
        return timer.result()

    return run


class StepTimer(pl.Callback):
    """Times a Lightning fit from the first batch after ``warm`` batches to the end of batch
    ``last`` (or, without ``last``, to ``on_train_end``).

    The device is synchronised only at those two points (not per step), so host/device overlap
    is measured as it happens; stopping at the last batch leaves the fit's end-of-training hooks
    out. ``steps_per_batch``: training steps per Lightning batch (a sink of ``sink_size`` steps in
    sink mode).
    """

    def __init__(self, warm: int, device: torch.device, steps_per_batch: int = 1,
                 last: int | None = None) -> None:
        self.warm, self.device, self.steps_per_batch = warm, device, steps_per_batch
        self.last = last
        self.seen = 0
        self.t0: float | None = None
        self.t1: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.seen == self.warm:
            sync(self.device)
            self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.seen += 1
        if self.seen == self.last:
            sync(self.device)
            self.t1 = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        if self.t1 is None:
            sync(self.device)
            self.t1 = time.perf_counter()

    def result(self) -> tuple[float, int]:
        if self.t0 is None or self.t1 is None or self.seen <= self.warm:
            raise RuntimeError(f"StepTimer: {self.seen} batches seen, {self.warm} warm-up ones: "
                               "nothing was timed")
        if self.last is not None and self.seen != self.last:
            raise RuntimeError(f"StepTimer: {self.seen} batches seen, {self.last} expected")
        return self.t1 - self.t0, (self.seen - self.warm) * self.steps_per_batch


def trainer_flags(device: torch.device) -> dict:
    """Plain ``lightning.Trainer`` flags for one device, quiet (what ``Model`` uses too)."""
    return {"accelerator": "gpu" if device.type == "cuda" else "cpu", "devices": 1,
            **QUIET_TRAINER}


def loader(batches: list) -> torch.utils.data.DataLoader:
    """The batches (already on the device) as a DataLoader that yields them as they are."""
    return torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)


def cycled(batches: list, n: int) -> list:
    return [batches[i % len(batches)] for i in range(n)]


def measure(variants: dict[str, Runner], budget: Budget, share_s: float, *, dry_run: bool,
            min_rounds: int = 3, dry_rounds: int = 2, max_rounds: int = 30, rounds_goal: int = 7,
            n_init: int = 8, n_min: int = 4, n_max: int = 2000,
            target_bounds: tuple[float, float] = (0.05, 1.0), log: Callable = print) -> dict:
    """Warm-up (calibration) call per variant, then interleaved rounds within ``share_s``.

    The steps per measurement are chosen per variant so that one measurement lasts about the
    same time for every variant, sized for ``rounds_goal`` rounds in ``share_s``. Rounds then
    run in rotating order while the next one still fits (at least ``min_rounds``, unless the
    script is 25% over its whole budget). A dry run does one warm-up call and ``dry_rounds``
    rounds of ``n_min`` steps.

    Returns:
        ``{"errors": {name: message}, "steps_per_s": {name: [per round]}, "median_steps_per_s",
        "steps_per_measurement", "seconds_per_step_warmup", "call_overhead_s", "rounds",
        "round_seconds", "share_s", "spent_s"}``. A variant that raised (on CUDA; a dry run
        re-raises) is left out of all but ``errors``.
    """
    names = list(variants)
    start = time.perf_counter()
    per_step: dict[str, float] = {}
    overhead: dict[str, float] = {}
    errors: dict[str, str] = {}

    def call(k: str, n: int) -> tuple[float, int] | None:
        """One measurement; a variant that raises is recorded in ``errors`` and dropped."""
        try:
            return variants[k](n)
        except Exception as e:  # noqa: BLE001 - one broken variant must not lose the others
            errors[k] = f"{type(e).__name__}: {e}"
            log(f"  {k} FAILED: {errors[k]}")
            if dry_run and os.environ.get("GPU_BENCH_STRICT", "1") == "1":
                raise
            names.remove(k)
            return None

    for k in list(names):
        t0 = time.perf_counter()
        got = call(k, n_min if dry_run else n_init)
        if got is None:
            continue
        secs, steps = got
        wall = time.perf_counter() - t0
        per_step[k] = secs / max(steps, 1)
        overhead[k] = max(wall - secs, 0.0)
        log(f"  warm-up {k}: {per_step[k] * 1e3:.3f} ms/step, call overhead {overhead[k]:.2f} s")
    if dry_run:
        n_of = {k: n_min for k in names}
    else:
        left = share_s - (time.perf_counter() - start)
        fixed = sum(overhead.values())
        target = (left / rounds_goal - fixed) / max(len(names), 1)
        target = min(max(target, target_bounds[0]), target_bounds[1])
        n_of = {k: int(min(max(math.ceil(target / max(per_step[k], 1e-7)), n_min), n_max))
                for k in names}
    steps_per_s: dict[str, list[float]] = {k: [] for k in names}
    steps_done: dict[str, list[int]] = {k: [] for k in names}
    round_times: list[float] = []
    deadline = start + share_s
    for r in range(max_rounds):
        if dry_run and r >= dry_rounds:
            break
        if not dry_run and r >= min_rounds and time.perf_counter() + round_times[-1] > deadline:
            break
        if not dry_run and r >= 2 and budget.left() < -0.25 * budget.seconds:
            log(f"  stopping after {r} rounds: 25% over the script's budget")
            break
        t_round = time.perf_counter()
        order = names[r % len(names):] + names[: r % len(names)] if names else []
        for k in order:
            got = call(k, n_of[k])
            if got is None:
                steps_per_s.pop(k)
                steps_done.pop(k)
                continue
            secs, steps = got
            steps_per_s[k].append(steps / secs)
            steps_done[k].append(steps)
        round_times.append(time.perf_counter() - t_round)
        log(f"  round {r + 1}: {round_times[-1]:.1f} s")
    return {
        "errors": errors,
        "steps_per_s": steps_per_s,
        "median_steps_per_s": {k: statistics.median(v) for k, v in steps_per_s.items()},
        "steps_per_measurement": {k: statistics.median(v) for k, v in steps_done.items()},
        "seconds_per_step_warmup": per_step,
        "call_overhead_s": overhead,
        "rounds": len(round_times),
        "round_seconds": round_times,
        "share_s": share_s,
        "spent_s": time.perf_counter() - start,
    }


def paired_ratio(res: dict, a: str, b: str) -> float | None:
    """Median over rounds of ``steps/s(a) / steps/s(b)`` measured in the same round (None when
    either variant failed)."""
    sa, sb = res["steps_per_s"].get(a), res["steps_per_s"].get(b)
    if not sa or not sb:
        return None
    return statistics.median(x / y for x, y in zip(sa, sb))


def target(name: str, value: float | None, op: str, threshold: float) -> dict:
    """A target record (:class:`bench._common.Target`); a missing value counts as not met."""
    return Target(name, op, threshold).check(value)


# ----------------------------------------------------------------------------- results
def write_results(name: str, out: Path, payload: dict, md_lines: list[str]) -> tuple[Path, Path]:
    """``gpu_<name>.json`` and ``gpu_<name>.md`` in ``out``; returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    jpath, mpath = out / f"gpu_{name}.json", out / f"gpu_{name}.md"
    jpath.write_text(json.dumps({"benchmark": f"gpu_{name}", **payload}, indent=2,
                                default=str) + "\n")
    mpath.write_text("\n".join(md_lines).rstrip() + "\n")
    return jpath, mpath


md_targets = targets_table


# ----------------------------------------------------------------------------- nets
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.short(x))


class ResNet18(nn.Module):
    """ResNet-18 for 32x32 images (3x3 stem, no max-pool; ``width`` 64 is the standard one)."""

    def __init__(self, num_classes: int = 10, width: int = 64) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w),
                                  nn.ReLU(inplace=True))
        layers: list[nn.Module] = []
        cin = w
        for i, cout in enumerate((w, 2 * w, 4 * w, 8 * w)):
            stride = 1 if i == 0 else 2
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


class TransformerClassifier(nn.Module):
    """Token embedding + ``nn.TransformerEncoderLayer`` blocks (pre-norm, GELU) + mean-pool head."""

    def __init__(self, vocab: int = 1024, d_model: int = 512, nhead: int = 8, layers: int = 4,
                 seq: int = 256, num_classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(seq, d_model) * 0.02)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, nhead, 4 * d_model, dropout=0.0,
                                       activation="gelu", batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h).mean(dim=1))


#: the two workloads of gpu_amp / gpu_loss_scale: full size, and the dry run's tiny size
WORKLOADS: dict[str, dict[str, dict]] = {
    "resnet18": {
        "full": {"batch": 256, "image": 32, "width": 64},
        "dry": {"batch": 2, "image": 8, "width": 4},
    },
    "transformer": {
        "full": {"batch": 64, "seq": 256, "d_model": 512, "nhead": 8, "layers": 4,
                 "vocab": 1024},
        "dry": {"batch": 2, "seq": 8, "d_model": 16, "nhead": 2, "layers": 1, "vocab": 32},
    },
}


def workload(name: str, dry_run: bool) -> dict:
    """``{"make": () -> nn.Module (seeded), "batch": (B, *shape) input maker, "title"}``."""
    cfg = WORKLOADS[name]["dry" if dry_run else "full"]
    if name == "resnet18":
        return {
            "make": lambda: ResNet18(10, cfg["width"]),
            "input": lambda g, dev: torch.randn(cfg["batch"], 3, cfg["image"], cfg["image"],
                                                generator=g).to(dev),
            "title": f"ResNet-18 (width {cfg['width']}), 3x{cfg['image']}x{cfg['image']}, "
                     f"batch {cfg['batch']}",
            "config": cfg,
        }
    return {
        "make": lambda: TransformerClassifier(cfg["vocab"], cfg["d_model"], cfg["nhead"],
                                              cfg["layers"], cfg["seq"]),
        "input": lambda g, dev: torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]),
                                              generator=g).to(dev),
        "title": f"Transformer encoder {cfg['layers']}x(d {cfg['d_model']}, {cfg['nhead']} heads,"
                 f" ff {4 * cfg['d_model']}), seq {cfg['seq']}, batch {cfg['batch']}",
        "config": cfg,
    }


def make_batches(wl: dict, device: torch.device, k: int = 4, seed: int = 0) -> list:
    """``k`` distinct ``(input, label)`` batches generated once and stored on ``device``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(k):
        x = wl["input"](g, device)
        y = torch.randint(0, 10, (x.shape[0],), generator=g).to(device)
        out.append((x, y))
    return out


def seeded(make: Callable[[], nn.Module], device: torch.device, seed: int = 0) -> nn.Module:
    """The same initial weights for every variant."""
    torch.manual_seed(seed)
    return make().to(device)


def sgd(net: nn.Module, lr: float = 0.01) -> torch.optim.SGD:
    return torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)


@contextlib.contextmanager
def lightning_quiet() -> Iterator[None]:
    """lit_amp's own quiet block for a Trainer call (banners and data-loader hints)."""
    from lit_amp.model.model import quiet_lightning

    with quiet_lightning():
        yield
