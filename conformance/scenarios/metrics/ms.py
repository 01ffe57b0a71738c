"""Metric names and metric objects (MindSpore side)."""

import types

import numpy as np
from mindspore import Tensor
from mindspore import train as T
from mindspore.train import metrics as M

from conformance import _common as C
from conformance import _ms as S
from conformance.scenarios.metrics.common_metrics import scenario


def py(v):
    if isinstance(v, Tensor):
        v = v.asnumpy()
    if isinstance(v, np.ndarray) and v.ndim == 0:
        return float(v)
    if isinstance(v, (np.floating, float, int)):
        return float(v)
    return v


def run():
    K = types.SimpleNamespace(
        get_metric_fn=M.get_metric_fn,
        cls=lambda name: getattr(M, name),
        tensor=Tensor,
        value=lambda m: py(m.eval()),
        py=py,
        exc_name=C.exc_name,
        guard=C.guard,
        Model=T.Model,
        S=S,
    )
    return {"mindspore": S.VERSION, **scenario(K)}


if __name__ == "__main__":
    C.main(run)
