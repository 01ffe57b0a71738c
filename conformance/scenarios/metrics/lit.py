"""Metric names and metric objects (lit_amp port)."""

import types

import numpy as np
import torch

import lit_amp.metrics as M
from conformance import _common as C
from conformance import _lit as S
from conformance.scenarios.metrics.common_metrics import scenario
from lit_amp import Model


def tensor(a):
    t = torch.from_numpy(np.asarray(a))
    return t.long() if t.dtype == torch.int32 else t


def py(v):
    v = M.metric_value_to_python(v)
    if isinstance(v, (np.floating, float, int)):
        return float(v)
    return v


def run():
    K = types.SimpleNamespace(
        get_metric_fn=M.get_metric_fn,
        cls=lambda name: getattr(M, name),
        tensor=tensor,
        value=lambda m: py(m.compute()),
        py=py,
        exc_name=C.exc_name,
        guard=C.guard,
        Model=Model,
        S=S,
    )
    return scenario(K)


if __name__ == "__main__":
    C.main(run)
