"""THOR schedules and thor() argument checks (lit_amp port)."""

import types

import numpy as np
import torch

from conformance import _common as C
from conformance.scenarios.thor.common_thor import scenario
from lit_amp import thor


def net():
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8, bias=False), torch.nn.ReLU(), torch.nn.Linear(8, 3, bias=False)
    )


def run():
    K = types.SimpleNamespace(
        thor=thor,
        tensor=lambda a: torch.from_numpy(np.asarray(a)),
        net=net,
        exc_name=C.exc_name,
        guard=C.guard,
        lr_fn=thor.get_thor_lr,
        damping_fn=thor.get_thor_damping,
        np=lambda t: t.numpy() if torch.is_tensor(t) else np.asarray(t),
    )
    return scenario(K)


if __name__ == "__main__":
    C.main(run)
