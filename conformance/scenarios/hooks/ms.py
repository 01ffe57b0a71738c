"""Hook order, cb_params counters and request_stop (MindSpore side)."""

from mindspore.train import Callback, Model

from conformance import _common as C
from conformance import _ms as S
from conformance.scenarios.hooks.common_hooks import make_recorder, scenario


def model():
    n = S.net()
    return Model(n, S.loss_fn(), S.opt(n), metrics={"acc", "loss"})


def run():
    out = {"mindspore": S.VERSION}
    out.update(scenario(make_recorder(Callback), model, S.train_ds, S.valid_ds))
    return out


if __name__ == "__main__":
    C.main(run)
