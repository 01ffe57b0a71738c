"""``Model``'s train / fit / eval / predict: callback order and counters (docs/semantics.md §1.4)
in sink and non-sink mode, stop requests, resume, evaluation and prediction."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn

from lit_amp import Model
from lit_amp.callbacks import Callback, History, LossMonitor
from lit_amp.callbacks.base import EVAL_HOOKS, TRAIN_HOOKS
from tests.helpers.data import make_batches, make_net

HOOKS = TRAIN_HOOKS + EVAL_HOOKS


class Recorder(Callback):
    """Records (hook, cur_epoch_num, cur_step_num, mode) for every new-style hook."""

    def __init__(self, stop_at_step: int | None = None):
        self.events: list[tuple] = []
        self.stop_at_step = stop_at_step
        self.seen: dict[str, object] = {}

    def _rec(self, name, rc):
        cb = rc.original_args()
        self.events.append((name, cb.get("cur_epoch_num"), cb.get("cur_step_num"), cb.get("mode")))
        if name == "on_train_epoch_end":
            self.seen.setdefault("metrics", []).append(dict(cb.get("metrics") or {}))
            self.seen.setdefault("eval_results", []).append(dict(cb.get("eval_results") or {}))
        if name == "on_train_step_end":
            self.seen["net_outputs"] = cb.net_outputs
            self.seen["batch_num"] = cb.batch_num
            self.seen["epoch_num"] = cb.epoch_num
            if self.stop_at_step is not None and cb.cur_step_num >= self.stop_at_step:
                rc.request_stop()


for _h in HOOKS:
    setattr(Recorder, _h, (lambda h: lambda self, rc: self._rec(h, rc))(_h))


def _model(metrics=None, net=None):
    net = net or make_net()
    return Model(
        net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1), metrics=metrics
    )


def names(events):
    return [e[0] for e in events]


def test_non_sink_order_and_counters():
    rec = Recorder()
    _model().train(2, make_batches(3), callbacks=[rec])
    expected = ["on_train_begin"]
    for _ in range(2):
        expected += ["on_train_epoch_begin"] + ["on_train_step_begin", "on_train_step_end"] * 3
        expected += ["on_train_epoch_end"]
    expected += ["on_train_end"]
    assert names(rec.events) == expected
    steps = [e[2] for e in rec.events if e[0] == "on_train_step_end"]
    assert steps == [1, 2, 3, 4, 5, 6]  # global and cumulative
    epochs = [e[1] for e in rec.events if e[0] == "on_train_epoch_end"]
    assert epochs == [1, 2]  # 1-based
    assert rec.seen["batch_num"] == 3 and rec.seen["epoch_num"] == 2
    assert torch.is_tensor(rec.seen["net_outputs"]) and rec.seen["net_outputs"].dim() == 0


def test_sink_order_counters_and_stream_carry_over():
    # batches are marked by their index; the network records what it trained on
    data = [(torch.full((2, 4), float(i)), torch.zeros(2, dtype=torch.long)) for i in range(5)]
    seen: list[int] = []
    net = make_net()
    net[0].register_forward_pre_hook(lambda m, args: seen.append(int(args[0][0, 0])))
    rec = Recorder()
    _model(net=net).train(4, data, callbacks=[rec], dataset_sink_mode=True, sink_size=3)
    # one step_begin/step_end pair per epoch (per sink), cur_step_num advanced by sink_size
    expected = ["on_train_begin"]
    for _ in range(4):
        expected += [
            "on_train_epoch_begin",
            "on_train_step_begin",
            "on_train_step_end",
            "on_train_epoch_end",
        ]
    expected += ["on_train_end"]
    assert names(rec.events) == expected
    assert [e[2] for e in rec.events if e[0] == "on_train_step_end"] == [3, 6, 9, 12]
    assert rec.seen["batch_num"] == 3
    # epoch k trains on stream batches [(k-1)*3, k*3), wrapping across the 5-batch dataset
    assert seen == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]


def test_sink_size_minus_one_is_dataset_size():
    rec = Recorder()
    _model().train(2, make_batches(4), callbacks=[rec], dataset_sink_mode=True)
    assert [e[2] for e in rec.events if e[0] == "on_train_step_end"] == [4, 8]


def test_unbounded_iterable_with_sink_size():
    class Endless:
        def __iter__(self):
            i = 0
            while True:
                yield make_batches(1, seed=i)[0]
                i += 1

    rec = Recorder()
    _model().train(3, Endless(), callbacks=[rec], dataset_sink_mode=True, sink_size=5)
    assert [e[2] for e in rec.events if e[0] == "on_train_step_end"] == [5, 10, 15]


def test_request_stop_non_sink_breaks_after_the_step():
    rec = Recorder(stop_at_step=4)
    _model().train(5, make_batches(3), callbacks=[rec])
    steps = [e[2] for e in rec.events if e[0] == "on_train_step_end"]
    assert steps == [1, 2, 3, 4]
    # the epoch of the stop still ends, then training ends
    assert names(rec.events)[-3:] == ["on_train_step_end", "on_train_epoch_end", "on_train_end"]


def test_request_stop_sink_takes_effect_at_sink_end():
    rec = Recorder(stop_at_step=1)
    _model().train(5, make_batches(3), callbacks=[rec], dataset_sink_mode=True, sink_size=3)
    assert [e[2] for e in rec.events if e[0] == "on_train_step_end"] == [3]
    assert [e[1] for e in rec.events if e[0] == "on_train_epoch_end"] == [1]


def test_initial_epoch_resumes_the_count():
    rec = Recorder()
    model = _model()
    model.train(5, make_batches(2), callbacks=[rec], initial_epoch=3)
    assert [e[1] for e in rec.events if e[0] == "on_train_epoch_begin"] == [4, 5]
    assert rec.seen["epoch_num"] == 2
    assert model._current_epoch_num == 5 and model._current_step_num == 2


def test_fit_eval_schedule_and_visibility():
    rec, hist = Recorder(), History()
    model = _model(metrics={"acc", "loss"})
    model.fit(4, make_batches(3), make_batches(2, seed=1), valid_frequency=2, callbacks=[rec, hist])
    ev = rec.events
    # evaluation runs after epochs 2 and 4, between the last step and on_train_epoch_end
    eval_epochs = [e[1] for e in ev if e[0] == "on_eval_begin"]
    assert eval_epochs == [2, 4]
    i = names(ev).index("on_eval_begin")
    assert ev[i - 1][0] == "on_train_step_end" and ev[i][3] == "eval"
    j = names(ev).index("on_train_epoch_end", i)
    assert names(ev)[i:j] == [
        "on_eval_begin",
        "on_eval_epoch_begin",
        "on_eval_step_begin",
        "on_eval_step_end",
        "on_eval_step_begin",
        "on_eval_step_end",
        "on_eval_epoch_end",
        "on_eval_end",
    ]
    # eval counts its own steps, train's counters are restored afterwards
    assert [e[2] for e in ev[i:j] if e[0] == "on_eval_step_end"] == [1, 2]
    assert ev[j][2] == 6 and ev[j][3] == "train"
    # metrics and eval_results only at the epoch end of evaluated epochs
    assert rec.seen["metrics"][0] == {} and set(rec.seen["metrics"][1]) == {"acc", "loss"}
    assert set(rec.seen["eval_results"][1]) == {"acc", "loss", "eval_loss"}
    # the Loss metric averages per-batch losses: equal to eval_loss here
    assert rec.seen["eval_results"][1]["loss"] == pytest.approx(
        rec.seen["eval_results"][1]["eval_loss"], rel=1e-5
    )
    # a built-in (History) is not called during fit's eval but sees the metrics at epoch end
    assert hist.epoch["epoch"] == [1, 2, 3, 4]
    assert len(hist.history["acc"]) == 2


def test_fit_valid_frequency_list():
    rec = Recorder()
    _model(metrics={"acc"}).fit(
        4, make_batches(2), make_batches(1), valid_frequency=[1, 3], callbacks=[rec]
    )
    assert [e[1] for e in rec.events if e[0] == "on_eval_begin"] == [1, 3]


def test_lightning_callbacks_mix_in():
    class Count(L.Callback):
        n = 0

        def on_train_batch_end(self, *args):
            Count.n += 1

    rec = Recorder()
    _model().train(2, make_batches(3), callbacks=[rec, Count()])
    assert Count.n == 6 and len(rec.events) > 0


def test_eval_callbacks_and_counters():
    rec = Recorder()
    model = _model(metrics={"acc"})
    res = model.eval(make_batches(3), callbacks=[rec])
    assert set(res) == {"acc"}
    assert names(rec.events) == ["on_eval_begin", "on_eval_epoch_begin"] + [
        "on_eval_step_begin",
        "on_eval_step_end",
    ] * 3 + ["on_eval_epoch_end", "on_eval_end"]


def test_loss_monitor_output_format(capsys):
    _model().train(2, make_batches(3), callbacks=[LossMonitor(per_print_times=3)])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("epoch")]
    assert len(lines) == 2
    assert lines[0].startswith("epoch: 1 step: 3, loss is ")
    assert lines[1].startswith("epoch: 2 step: 3, loss is ")


def test_training_converges_and_eval_matches_hand_computation():
    net = make_net()
    model = Model(
        net,
        nn.CrossEntropyLoss(),
        torch.optim.Adam(net.parameters(), lr=0.05),
        metrics={"acc", "loss"},
    )
    train, test = make_batches(8), make_batches(4, seed=3)
    before = model.eval(test)["acc"]
    model.train(10, train)
    res = model.eval(test)
    x = torch.cat([b[0] for b in test])
    y = torch.cat([b[1] for b in test])
    with torch.no_grad():
        logits = net(x)
    hand_acc = (logits.argmax(1) == y).float().mean().item()
    assert res["acc"] == pytest.approx(hand_acc)
    assert res["acc"] > 0.9 > before or res["acc"] > 0.95


def test_predict_returns_network_output_in_eval_mode():
    net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    model = Model(net)
    x = torch.randn(3, 4)
    out1, out2 = model.predict(x), model.predict(x)
    assert torch.equal(out1, out2)  # dropout off: eval mode
    assert not net.training


def test_network_without_optimizer_trains_itself():
    class SelfUpdating(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x, y):
            self.calls += 1
            return torch.tensor(float(self.calls))

    net = SelfUpdating()
    Model(net).train(2, make_batches(3))
    assert net.calls == 6


def test_train_network_properties():
    model = _model(metrics={"acc"})
    x, y = make_batches(1)[0]
    loss = model.train_network(x, y)  # a callable one-step module, as in MindSpore
    assert loss.dim() == 0
    out = model.eval_network(x, y)
    assert len(out) == 3 and out[1].shape == (16, 2)
    assert model.predict_network is model.lit_model.network
