"""RecModel.online_train validation: the held-out window (test-then-train), a fixed set."""

from __future__ import annotations

import torch

from lit_amp.rec import RecModel, ValidationOptions
from lit_amp.rec.sources import SyntheticClickSource
from tests.rec._helpers import Recorder, make_model


def stream(n_batches: int | None = None, bs: int = 16, **kw):
    return SyntheticClickSource(
        batch_size=bs, num_records=None if n_batches is None else n_batches * bs, **kw
    )


# ------------------------------------------------------------------ validation
def test_validation_on_held_out_window_is_test_then_train():
    model = make_model(metrics={"auc", "loss"})
    rec = Recorder()
    evaluated: list[list[int]] = []
    orig = model.lit_model.eval_step

    def spy(batch):
        evaluated.append(batch[0]["record_id"].tolist())
        return orig(batch)

    model.lit_model.eval_step = spy
    s = model.online_train(
        stream(6, bs=8),
        callbacks=rec,
        validation=ValidationOptions(valid_every_n_steps=2, valid_window=1),
    )
    assert s.steps == 6
    trained = rec.ids
    # after steps 2 and 4 the next batch (3rd, 5th) is evaluated, then trained
    assert evaluated == [trained[2], trained[4]]
    assert sum(trained, []) == list(range(48))  # nothing withheld from training
    hooks = rec.hooks()
    assert hooks.count("on_eval_begin") == 2 and hooks.count("on_eval_step_end") == 2
    # non-sink: eval_results visible at the (single) epoch end
    assert set(rec.metrics_seen[-1]) == {"auc", "loss", "eval_loss"}


def test_validation_results_at_epoch_end_in_sink_mode(monkeypatch):
    monkeypatch.setattr(RecModel, "_sink_supported", lambda self: True)
    model = make_model(metrics={"auc"})
    rec = Recorder()
    valid = list(stream(2, bs=32, seed=9))
    model.online_train(
        stream(4),
        callbacks=rec,
        validation=ValidationOptions(valid_every_n_steps=2, valid_dataset=valid),
    )
    seen = rec.metrics_seen
    assert seen[0] is None and seen[2] is None
    assert set(seen[1]) == {"auc", "eval_loss"} and set(seen[3]) == {"auc", "eval_loss"}
    assert 0.0 <= seen[1]["auc"] <= 1.0


def test_model_still_trains_in_train_mode_after_validation():
    model = make_model(metrics={"auc"})
    model.online_train(stream(4), validation=ValidationOptions(valid_every_n_steps=1))
    assert model.lit_model.network.training


def test_training_reduces_the_loss_on_the_synthetic_stream():
    model = make_model()
    losses = []
    model.online_train(
        stream(150, bs=128, seed=3),
        callbacks=Recorder(lambda rc: losses.append(float(rc.original_args().net_outputs))),
    )
    assert sum(losses[-20:]) / 20 < sum(losses[:20]) / 20
    assert torch.isfinite(torch.tensor(losses)).all()
