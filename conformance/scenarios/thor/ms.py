"""THOR schedules and thor() argument checks (MindSpore side).

get_thor_lr / get_thor_damping are not part of the mindspore package: they live in the model
zoo (official/cv/ResNet/src/lr_generator.py). Their goldens are computed here from that rule
(written out below, not imported) and marked {"__derived__": ...}.
"""

import types

import numpy as np
from mindspore import Tensor, nn

from conformance import _common as C
from conformance import _ms as S
from conformance.scenarios.thor.common_thor import scenario


def zoo_lr(global_step, lr_init, decay, total_epochs, steps_per_epoch, decay_epochs=100):
    """Model-zoo rule: lr_init * (1 - e/total)^decay with e = (i+1)/steps_per_epoch, halved
    from e >= decay_epochs and again from e >= decay_epochs + 1; float32; from global_step on."""
    vals = []
    for i in range(total_epochs * steps_per_epoch):
        e = (i + 1) / steps_per_epoch
        v = lr_init * (1.0 - e / total_epochs) ** decay
        v *= 0.5 if e >= decay_epochs else 1.0
        v *= 0.5 if e >= decay_epochs + 1 else 1.0
        vals.append(v)
    return np.asarray(vals, np.float32)[global_step:]


def zoo_damping(global_step, damping_init, decay_rate, total_epochs, steps_per_epoch):
    """Model-zoo rule: damping_init * decay_rate^(e/10), e = (i+1)/steps_per_epoch; float32."""
    vals = [
        damping_init * decay_rate ** (((i + 1) / steps_per_epoch) / 10)
        for i in range(total_epochs * steps_per_epoch)
    ]
    return np.asarray(vals, np.float32)[global_step:]


def net():
    # MindSpore's ThorGpu maps layers by counting weights: a Dense with a bias fails in its
    # constructor (IndexError in _process_matrix_init_and_weight_idx_map), so no biases here
    return nn.SequentialCell(
        nn.Dense(4, 8, has_bias=False), nn.ReLU(), nn.Dense(8, 3, has_bias=False)
    )


def run():
    K = types.SimpleNamespace(
        thor=nn.thor,
        tensor=Tensor,
        net=net,
        exc_name=C.exc_name,
        guard=C.guard,
        lr_fn=zoo_lr,
        damping_fn=zoo_damping,
        np=np.asarray,
    )
    out = scenario(K)
    why = "model-zoo lr_generator rule (not in the mindspore package), computed in float32"
    for k in list(out):
        if k.startswith(("lr.", "damping.")):
            out[k] = {"__derived__": out[k], "why": why}

    def train_step():
        from mindspore.train import Model

        n = net()
        opt = nn.thor(
            n,
            Tensor(np.full(8, 0.05, np.float32)),
            Tensor(np.full(8, 0.03, np.float32)),
            0.9,
            frequency=2,
        )
        Model(n, S.loss_fn(), opt).train(1, S.train_ds())

    out["train.ms_cpu"] = {
        "__ms_unsupported__": C.exc_name(train_step) + ": CholeskyTrsm "
        "(THOR's inverse) has no CPU kernel"
    }
    return {"mindspore": S.VERSION, **out}


if __name__ == "__main__":
    C.main(run)
