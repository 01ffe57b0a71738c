"""Loss-scale managers, update cells, TrainOneStepWithLossScaleCell with overflows (MindSpore)."""

import types

import numpy as np
from mindspore import Tensor, amp, nn, ops
from mindspore.train import DynamicLossScaleManager, FixedLossScaleManager

from conformance import _common as C
from conformance import _ms as S
from conformance.scenarios.loss_scale.common_ls import scenario


def scalar(v):
    if isinstance(v, Tensor):
        v = v.asnumpy()
    return float(np.asarray(v, np.float64).reshape(-1)[0])


class CpuTOSWLS(nn.TrainOneStepWithLossScaleCell):
    """On CPU MindSpore takes the Ascend overflow check (NPUGetFloatStatusV2: RuntimeError
    'Unsupported op ... on CPU') and the GPU one needs FloatStatus (GPU only). Everything else of
    the stock cell runs; only the overflow flag is computed with amp.all_finite (isfinite)."""

    def get_overflow_status(self, status, compute_output):
        return ops.logical_not(amp.all_finite(compute_output))


def run():
    K = types.SimpleNamespace(
        net=lambda: S.net(bn=False),
        opt=S.opt,
        loss_fn=S.loss_fn,
        WithLossCell=nn.WithLossCell,
        TOSWLS=CpuTOSWLS,
        Fixed=FixedLossScaleManager,
        Dynamic=DynamicLossScaleManager,
        StaticLossScaler=amp.StaticLossScaler,
        DynamicLossScaler=amp.DynamicLossScaler,
        all_finite=amp.all_finite,
        native_scale_sense=lambda m: m.get_update_cell(),
        tensor=Tensor,
        scalar=scalar,
        boolv=lambda t: bool(np.asarray(t.asnumpy() if isinstance(t, Tensor) else t).all()),
        np=lambda t: t.asnumpy(),
        exc_name=C.exc_name,
        guard=C.guard,
        fc2_weight=lambda n: n.fc2.weight.asnumpy(),
        cell_kind=lambda c: None if c is None else type(c).__name__,
    )
    out = {"mindspore": S.VERSION, **scenario(K)}

    def as_is():
        net = S.net(bn=False)
        cell = nn.TrainOneStepWithLossScaleCell(
            nn.WithLossCell(net, S.loss_fn()), S.opt(net), scale_sense=Tensor(np.float32(16.0))
        )
        x, y = C.data(4)
        cell(Tensor(x), Tensor(y))

    out["cell.ms_cpu_as_is"] = {
        "__ms_unsupported__": C.exc_name(as_is) + ": the stock cell's "
        "overflow check is NPUGetFloatStatusV2 on CPU; the cell.* goldens "
        "compute the overflow flag with amp.all_finite (CpuTOSWLS)"
    }
    return out


if __name__ == "__main__":
    C.main(run)
