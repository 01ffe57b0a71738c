"""Built-in callbacks, framework-neutral: ``K`` is a namespace of one side's classes/helpers.

K provides: Model, Callback, History, LambdaCallback, EarlyStopping, ReduceLROnPlateau,
ModelCheckpoint, CheckpointConfig, LossMonitor, TimeMonitor, LearningRateScheduler, S (the
side's helper module), get_lr(cb_params) -> float.
"""

import contextlib
import io
import os
import re
import tempfile


def _norm(text):
    """Printed lines with numbers reduced to a shape: floats -> <f>, keeps ints."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return [re.sub(r"-?\d+\.\d+(e[-+]?\d+)?", "<f>", ln) for ln in lines]


def _losses_printed(text):
    return [float(m) for m in re.findall(r"loss is (-?\d+\.\d+)", text)]


def scenario(K):
    S = K.S
    out = {}

    def model(metrics=frozenset({"acc", "loss"})):
        n = S.net()
        return Model(n, S.loss_fn(), S.opt(n), metrics=set(metrics) if metrics else None)

    Model = K.Model

    class EpochLog(K.Callback):
        def __init__(self):
            super().__init__()
            self.lr, self.eval_results, self.epochs = [], [], []

        def on_train_epoch_end(self, rc):
            cb = rc.original_args()
            self.epochs.append(cb.get("cur_epoch_num"))
            self.lr.append(round(K.get_lr(cb), 7))
            self.eval_results.append(dict(cb.get("eval_results") or {}))

    # History alone in fit (built-ins only), and beside a custom callback
    h = K.History()
    model().fit(3, S.train_ds(), S.valid_ds(), callbacks=[h])
    out["history_alone.epoch"] = h.epoch
    out["history_alone.keys"] = sorted(h.history)
    out["history_alone.acc"] = h.history.get("acc")
    out["history_alone.net_output"] = h.history.get("net_output")
    h, log = K.History(), EpochLog()
    model().fit(3, S.train_ds(), S.valid_ds(), callbacks=[h, log])
    out["history_with_custom.epoch"] = h.epoch
    out["history_with_custom.acc"] = h.history.get("acc")
    out["fit.eval_results.keys"] = [sorted(r) for r in log.eval_results]
    out["fit.eval_results.acc"] = [r.get("acc") for r in log.eval_results]
    out["fit.eval_results.loss_metric"] = [r.get("loss") for r in log.eval_results]
    out["fit.eval_results.eval_loss"] = [r.get("eval_loss") for r in log.eval_results]

    # LambdaCallback alone in fit: which hooks fire
    calls = []
    hooks = ["on_train_begin", "on_train_epoch_end", "on_eval_begin", "on_eval_end", "on_train_end"]
    lam = K.LambdaCallback(**{hk: (lambda hh: lambda rc: calls.append(hh))(hk) for hk in hooks})
    model().fit(2, S.train_ds(), S.valid_ds(), callbacks=[lam])
    out["lambda_alone_in_fit.calls"] = calls
    calls2 = []
    lam = K.LambdaCallback(**{hk: (lambda hh: lambda rc: calls2.append(hh))(hk) for hk in hooks})
    model().eval(S.valid_ds(), callbacks=[lam])
    out["lambda_in_eval.calls"] = calls2

    # EarlyStopping on a metric (max mode) and on eval_loss
    for key, kw in {
        "es_acc_p1": dict(monitor="acc", patience=1),
        "es_acc_p2_delta": dict(monitor="acc", patience=2, min_delta=0.2),
        "es_loss_metric_p1": dict(monitor="loss", patience=1),
        "es_eval_loss_p1": dict(monitor="eval_loss", patience=1),
        "es_patience0": dict(monitor="acc", patience=0),
    }.items():
        log = EpochLog()
        model().fit(6, S.train_ds(), S.valid_ds(), callbacks=[log, K.EarlyStopping(**kw)])
        out[key + ".epochs_run"] = log.epochs

    # ReduceLROnPlateau on acc
    for key, kw in {
        "rlrop_acc": dict(monitor="acc", factor=0.5, patience=1),
        "rlrop_acc_cooldown": dict(monitor="acc", factor=0.5, patience=1, cooldown=1, min_lr=0.03),
    }.items():
        log = EpochLog()
        model().fit(6, S.train_ds(), S.valid_ds(), callbacks=[log, K.ReduceLROnPlateau(**kw)])
        out[key + ".lr"] = log.lr

    # LearningRateScheduler
    log = EpochLog()
    sched = K.LearningRateScheduler(lambda lr, step: lr * 0.5 if step % 3 == 0 else lr)
    model(None).train(3, S.train_ds(), callbacks=[log, sched])
    out["lr_scheduler.lr"] = log.lr

    # ModelCheckpoint names
    with tempfile.TemporaryDirectory() as d:
        cfg = K.CheckpointConfig(save_checkpoint_steps=2, keep_checkpoint_max=3)
        model(None).train(2, S.train_ds(), callbacks=[K.ModelCheckpoint("net", d, cfg)])
        files1 = sorted(os.listdir(d))
        cfg = K.CheckpointConfig(save_checkpoint_steps=4, keep_checkpoint_max=5)
        model(None).train(2, S.train_ds(), callbacks=[K.ModelCheckpoint("net", d, cfg)])
        files2 = sorted(os.listdir(d))
    out["ckpt.first_run.ckpt"] = [f for f in files1 if f.endswith(".ckpt")]
    out["ckpt.first_run.other"] = [f for f in files1 if not f.endswith(".ckpt")]
    out["ckpt.second_run.ckpt"] = [f for f in files2 if f.endswith(".ckpt")]
    with tempfile.TemporaryDirectory() as d:
        cfg = K.CheckpointConfig(
            save_checkpoint_steps=1, keep_checkpoint_max=0, keep_checkpoint_per_n_minutes=0
        )
        model(None).train(1, S.train_ds(), callbacks=[K.ModelCheckpoint("k", d, cfg)])
        out["ckpt.keep_zero.ckpt"] = sorted(f for f in os.listdir(d) if f.endswith(".ckpt"))

    # LossMonitor and TimeMonitor output
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        model(None).train(2, S.train_ds(), callbacks=[K.LossMonitor(2)])
    txt = buf.getvalue()
    out["loss_monitor.lines"] = _norm(txt)
    out["loss_monitor.losses"] = _losses_printed(txt)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        model().fit(1, S.train_ds(), S.valid_ds(), callbacks=[K.LossMonitor(3)])
    out["loss_monitor_fit.lines"] = _norm(buf.getvalue())
    for key, kw in {"time_monitor": {}, "time_monitor_data_time": {"data_time": True}}.items():
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            model(None).train(1, S.train_ds(), callbacks=[K.TimeMonitor(**kw)])
        out[key + ".lines"] = _norm(buf.getvalue())
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        model().fit(1, S.train_ds(), S.valid_ds(), callbacks=[K.TimeMonitor()])
    out["time_monitor_fit.lines"] = _norm(buf.getvalue())
    return out
