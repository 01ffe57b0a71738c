"""Loss-scale managers, update cells, TrainOneStepWithLossScaleCell with overflows (lit_amp port).

lit_amp does not export TrainOneStepWithLossScaleCell at top level; the port takes the class of
what build_train_network returns with a manager (the public path to it).
"""

import types

import numpy as np
import torch

import lit_amp
from conformance import _common as C
from conformance import _lit as S
from conformance.scenarios.loss_scale.common_ls import scenario


def tensor(a):
    t = torch.from_numpy(np.asarray(a))
    return t.long() if t.dtype == torch.int32 else t


def scalar(v):
    if torch.is_tensor(v):
        v = v.detach().double().reshape(-1)[0].item()
    return float(v)


def toswls_class():
    n = S.net(bn=False)
    step = lit_amp.build_train_network(
        n, S.opt(n), S.loss_fn(), level="O0", loss_scale_manager=lit_amp.FixedLossScaleManager(8.0)
    )
    return type(step)


def run():
    K = types.SimpleNamespace(
        net=lambda: S.net(bn=False),
        opt=S.opt,
        loss_fn=S.loss_fn,
        WithLossCell=lit_amp.WithLossCell,
        TOSWLS=toswls_class(),
        Fixed=lit_amp.FixedLossScaleManager,
        Dynamic=lit_amp.DynamicLossScaleManager,
        StaticLossScaler=lit_amp.StaticLossScaler,
        DynamicLossScaler=lit_amp.DynamicLossScaler,
        all_finite=lit_amp.all_finite,
        native_scale_sense=lambda m: m,
        tensor=tensor,
        scalar=scalar,
        boolv=lambda t: bool(torch.as_tensor(t).all()),
        np=lambda t: t.detach().numpy(),
        exc_name=C.exc_name,
        guard=C.guard,
        fc2_weight=lambda n: n.fc2.weight.detach().numpy(),
        cell_kind=lambda c: None if c is None else type(c).__name__,
    )
    return scenario(K)


if __name__ == "__main__":
    C.main(run)
