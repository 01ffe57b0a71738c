"""Model train/eval/predict/fit loss trajectories on identical weights (lit_amp port)."""

import torch

from conformance import _common as C
from conformance import _lit as S
from lit_amp import Model
from lit_amp.callbacks import Callback


class Losses(Callback):
    def __init__(self):
        self.losses, self.steps = [], []

    def on_train_step_end(self, rc):
        cb = rc.original_args()
        self.losses.append(S.loss_of(cb.net_outputs))
        self.steps.append(cb.cur_step_num)


def model(n=None, metrics=None):
    n = n or S.net()
    return n, Model(n, S.loss_fn(), S.opt(n), metrics=metrics)


def run():
    out = {}
    xv, _ = C.valid_data()
    xv4 = torch.from_numpy(xv[:4])
    n, m = model(metrics={"acc", "loss"})
    rec = Losses()
    m.train(2, S.train_ds(), callbacks=[rec], dataset_sink_mode=False)
    out["train.losses"] = rec.losses
    out["train.steps"] = rec.steps
    out["train.final_fc2_weight"] = S.np_(n.fc2.weight)
    out["train.final_bn_mean"] = S.np_(n.bn.running_mean)
    out["eval.metrics"] = m.eval(S.valid_ds(), dataset_sink_mode=False)
    out["predict.after_train"] = S.np_(m.predict(xv4))
    n, m = model()
    rec = Losses()
    m.train(2, S.train_ds(), callbacks=[rec], dataset_sink_mode=True, sink_size=-1)
    out["sink.losses_at_step_end"] = rec.losses
    out["sink.steps_at_step_end"] = rec.steps
    out["sink.final_fc2_weight"] = S.np_(n.fc2.weight)
    out["sink.last_loss"] = rec.losses[-1]
    n, m = model()
    out["predict.fresh"] = S.np_(m.predict(xv4))
    rec = Losses()
    m.train(1, S.train_ds(), callbacks=[rec], dataset_sink_mode=False)
    out["predict_then_train.losses"] = rec.losses
    n, m = model(metrics={"acc"})
    out["eval_then_train.eval"] = m.eval(S.valid_ds())
    rec = Losses()
    m.train(1, S.train_ds(), callbacks=[rec])
    out["eval_then_train.losses"] = rec.losses
    n, m = model(metrics={"acc", "loss"})
    rec = Losses()
    m.fit(2, S.train_ds(), S.valid_ds(), callbacks=[rec])
    out["fit.losses"] = rec.losses
    out["fit.eval_after"] = m.eval(S.valid_ds())
    n, m = model(n=S.net(bn=False))
    rec = Losses()
    m.train(2, S.train_ds(), callbacks=[rec])
    out["nobn.losses"] = rec.losses
    return out


if __name__ == "__main__":
    C.main(run)
