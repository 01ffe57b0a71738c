"""Shared recorder logic for the hooks scenario (framework-neutral: takes the Callback base)."""

HOOKS = (
    "on_train_begin",
    "on_train_epoch_begin",
    "on_train_step_begin",
    "on_train_step_end",
    "on_train_epoch_end",
    "on_train_end",
    "on_eval_begin",
    "on_eval_epoch_begin",
    "on_eval_step_begin",
    "on_eval_step_end",
    "on_eval_epoch_end",
    "on_eval_end",
)


def make_recorder(base):
    class Recorder(base):
        def __init__(self, stop_at=None, stop_step=None):
            super().__init__()
            self.events = []
            self.extra = []
            self.epochs = []
            self.stop_at, self.stop_step = stop_at, stop_step

        def _rec(self, name, rc):
            cb = rc.original_args()
            self.events.append(
                f"{name}|s={cb.get('cur_step_num')}|m={cb.get('mode')}|b={cb.get('batch_num')}|"
                f"n={cb.get('epoch_num')}"
            )
            self.epochs.append(f"{name}|e={cb.get('cur_epoch_num')}")
            mets = cb.get("metrics")
            evr = cb.get("eval_results")
            if mets or evr:
                self.extra.append(
                    f"{name}|metrics={sorted(mets) if mets else None}|"
                    f"eval_results={sorted(evr) if evr else None}"
                )
            if name == self.stop_at and (
                self.stop_step is None or cb.get("cur_step_num") == self.stop_step
            ):
                rc.request_stop()

    for h in HOOKS:
        setattr(Recorder, h, (lambda hh: lambda self, rc: self._rec(hh, rc))(h))
    return Recorder


def scenario(Recorder, model, train_ds, valid_ds):
    out = {}

    def go(key, what, **kw):
        rec = Recorder(**kw)
        m = model()
        if what == "train":
            m.train(2, train_ds(), callbacks=[rec], dataset_sink_mode=False)
        elif what == "sink":
            m.train(2, train_ds(), callbacks=[rec], dataset_sink_mode=True)
        elif what == "eval":
            m.eval(valid_ds(), callbacks=[rec])
        elif what == "fit":
            m.fit(2, train_ds(), valid_ds(), callbacks=[rec])
        elif what == "fit_freq2":
            m.fit(3, train_ds(), valid_ds(), valid_frequency=2, callbacks=[rec])
        out[key + ".events"] = rec.events
        out[key + ".metrics_at"] = rec.extra
        out[key + ".cur_epoch_num"] = rec.epochs

    go("train", "train")
    go("sink", "sink")
    go("eval", "eval")
    go("fit", "fit")
    go("fit_freq2", "fit_freq2")
    go("stop_step2", "train", stop_at="on_train_step_end", stop_step=2)
    go("stop_epoch_begin", "train", stop_at="on_train_epoch_begin")
    go("stop_train_begin", "train", stop_at="on_train_begin")
    go("stop_in_fit_eval", "fit", stop_at="on_eval_step_end", stop_step=1)
    go("stop_eval", "eval", stop_at="on_eval_step_end", stop_step=1)
    # derived: counts that pin the defects compactly
    ev = out["stop_train_begin.events"]
    out["stop_train_begin.n_steps"] = sum(e.startswith("on_train_step_end") for e in ev)
    ev = out["stop_in_fit_eval.events"]
    out["stop_in_fit_eval.n_train_epochs"] = sum(e.startswith("on_train_epoch_end") for e in ev)
    return out
