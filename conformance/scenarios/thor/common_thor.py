"""THOR: get_thor_lr/get_thor_damping schedules and thor() argument checks, framework-neutral.

K: thor(net, lr, damping, momentum, **kw), tensor(np), net(), exc_name, guard, lr_fn, damping_fn
(the side's schedule functions, returning array-likes), np(x) -> numpy.
"""

import numpy as np

LR_CASES = {
    "basic": (0, 0.1, 1.0, 2, 2),
    "resume": (3, 0.05803, 4.0839, 4, 3),
    "decay_epochs": (0, 0.05, 2.0, 6, 2, 2),
}
DAMP_CASES = {"basic": (0, 0.03, 0.5, 3, 2), "resume": (2, 0.03, 0.87, 4, 3)}


def scenario(K):
    out = {}
    for key, args in LR_CASES.items():
        out[f"lr.{key}"] = K.guard(
            lambda args=args: K.np(K.lr_fn(*args)).astype(np.float64).tolist()
        )
    for key, args in DAMP_CASES.items():
        out[f"damping.{key}"] = K.guard(
            lambda args=args: K.np(K.damping_fn(*args)).astype(np.float64).tolist()
        )
    lr = K.tensor(np.full(8, 0.05, np.float32))
    damp = K.tensor(np.full(8, 0.03, np.float32))
    for key, fn in {
        "ok": lambda: K.thor(K.net(), lr, damp, 0.9, frequency=2),
        "frequency_1": lambda: K.thor(K.net(), lr, damp, 0.9, frequency=1),
        "frequency_float": lambda: K.thor(K.net(), lr, damp, 0.9, frequency=2.5),
        "momentum_negative": lambda: K.thor(K.net(), lr, damp, -0.1, frequency=2),
        "momentum_int": lambda: K.thor(K.net(), lr, damp, 1, frequency=2),
        "lr_float": lambda: K.thor(K.net(), 0.05, damp, 0.9, frequency=2),
        "weight_decay_negative": lambda: K.thor(
            K.net(), lr, damp, 0.9, weight_decay=-1.0, frequency=2
        ),
        "loss_scale_zero": lambda: K.thor(K.net(), lr, damp, 0.9, loss_scale=0.0, frequency=2),
        "use_nesterov_int": lambda: K.thor(K.net(), lr, damp, 0.9, use_nesterov=1, frequency=2),
        "batch_size_zero": lambda: K.thor(K.net(), lr, damp, 0.9, batch_size=0, frequency=2),
    }.items():
        out[f"args.{key}"] = K.exc_name(fn)
    return out
