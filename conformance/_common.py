"""Shared, seeded numpy data and initial weights for both sides of every scenario.

Imports neither torch nor mindspore: each side converts the numpy arrays itself.

The reference network ("BNNet") is ``Dense(4, 8) -> BatchNorm1d(8) -> ReLU -> Dense(8, 3)``
(MindSpore ``nn.Dense`` / torch ``nn.Linear`` store the weight as ``(out, in)`` on both sides).
"""

from __future__ import annotations

import json
import math
import sys
import traceback

import numpy as np

IN, HID, OUT = 4, 8, 3
N_TRAIN, N_VALID, BATCH = 12, 8, 4  # 3 train batches, 2 valid batches
LR, MOMENTUM = 0.1, 0.9


def data(n: int = N_TRAIN, seed: int = 0):
    """(x float32 [n, IN], y int32 [n]) of a 3-class problem."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, IN)).astype(np.float32)
    w = np.random.default_rng(1234).standard_normal((IN, OUT)).astype(np.float32)
    y = np.argmax(x @ w, axis=1).astype(np.int32)
    return x, y


def valid_data():
    return data(N_VALID, seed=1)


def batches(x, y, batch: int = BATCH):
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(x), batch)]


def weights(seed: int = 7) -> dict[str, np.ndarray]:
    """Initial weights of BNNet, by a side-neutral name."""
    rng = np.random.default_rng(seed)
    return {
        "fc1.weight": (rng.standard_normal((HID, IN)) * 0.5).astype(np.float32),
        "fc1.bias": (rng.standard_normal(HID) * 0.1).astype(np.float32),
        "bn.gamma": np.ones(HID, np.float32),
        "bn.beta": np.zeros(HID, np.float32),
        "bn.mean": np.zeros(HID, np.float32),
        "bn.var": np.ones(HID, np.float32),
        "fc2.weight": (rng.standard_normal((OUT, HID)) * 0.5).astype(np.float32),
        "fc2.bias": (rng.standard_normal(OUT) * 0.1).astype(np.float32),
    }


def to_py(v):
    """A JSON-safe copy of a value (numpy/tensors already converted to numpy by the caller)."""
    if isinstance(v, dict):
        return {str(k): to_py(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_py(x) for x in v]
    if isinstance(v, np.ndarray):
        return to_py(v.tolist())
    if isinstance(v, (np.floating, float)):
        f = float(v)
        if math.isnan(f):
            return "nan"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return f
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.bool_,)):
        return bool(v)
    return v


def exc_name(fn) -> str:
    """'ok' when fn() returns, else the exception's class name."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - recording which type is the point
        return type(e).__name__
    return "ok"


def guard(fn):
    """Run one observable; on failure record 'error: <Type>'."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        return f"error: {type(e).__name__}"


def main(run) -> None:
    """Print run()'s observables as one JSON object on the last stdout line."""
    try:
        out = run()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    sys.stdout.flush()
    print("\n" + json.dumps(to_py(out), sort_keys=True))
