"""Hook order, cb_params counters and request_stop (lit_amp port)."""

from conformance import _common as C
from conformance import _lit as S
from conformance.scenarios.hooks.common_hooks import make_recorder, scenario
from lit_amp import Model
from lit_amp.callbacks import Callback


def model():
    n = S.net()
    return Model(n, S.loss_fn(), S.opt(n), metrics={"acc", "loss"})


def run():
    out = {}
    out.update(scenario(make_recorder(Callback), model, S.train_ds, S.valid_ds))
    return out


if __name__ == "__main__":
    C.main(run)
