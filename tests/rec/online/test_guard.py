"""The non-finite guard (``lit_amp.rec.online.guard``): a NaN / inf gradient never reaches the
parameters, and a non-finite weight is never published or checkpointed.

The batches are a plain iterable (no validation at the record boundary), so the bad values reach
the model; the record-level defence is in tests/faults/test_poison.py.
"""

from __future__ import annotations

import pytest
import torch

from lit_amp.rec import PublishOptions, StopOptions
from lit_amp.rec.online import guard
from lit_amp.rec.serving.reader import load_published
from tests.rec._helpers import make_model


class _Batches:
    """A plain iterable of batches (no validation at the record boundary)."""

    def __init__(self, batches) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def _batch(dense_value: float, n: int = 8):
    dense = torch.full((n, 13), dense_value)
    cat = torch.arange(n * 26).reshape(n, 26) % 64
    return {"dense": dense, "cat": cat, "record_id": torch.arange(n)}, torch.ones(n)


def test_non_finite_gradient_never_reaches_the_parameters(tmp_path):
    model = make_model()
    net = model._network
    batches = [_batch(0.5), _batch(float("inf")), _batch(0.5)]
    before = {}

    from lit_amp.callbacks import Callback

    class Snap(Callback):
        def on_train_step_begin(self, rc):
            before[int(rc.original_args().cur_step_num)] = [p.detach().clone()
                                                            for p in net.parameters()]

    summary = model.online_train(
        _Batches(batches), callbacks=[Snap()], dataset_sink_mode=False,
        stop=StopOptions(max_steps=3),
        publish=PublishOptions(tmp_path / "pub", publish_every_n_steps=1),
    )
    after_bad = before[3]  # parameters when step 3 began = after step 2 (the inf batch)
    assert all(torch.equal(a, b) for a, b in zip(before[2], after_bad))  # step 2 skipped
    assert all(torch.isfinite(p).all() for p in net.parameters())
    assert summary.skipped_steps == 1 and summary.steps == 3
    served = load_published(tmp_path / "pub")["network"]
    assert all(torch.isfinite(v).all() for v in served.values() if v.is_floating_point())


def test_non_finite_weights_are_never_published_or_checkpointed(tmp_path):
    import pytest

    from lit_amp.callbacks import Callback
    from lit_amp.rec import CheckpointOptions
    from lit_amp.rec.online.checkpoint_files import latest_checkpoint

    model = make_model()
    net = model._network

    class Break(Callback):  # weights going NaN by a path the gradient guard cannot see
        def on_train_step_end(self, rc):
            if rc.original_args().cur_step_num == 2:
                with torch.no_grad():
                    next(net.parameters()).fill_(float("nan"))

    with pytest.raises(RuntimeError, match="non-finite value"):
        model.online_train(
            _Batches([_batch(0.5)] * 4), callbacks=[Break()], dataset_sink_mode=False,
            publish=PublishOptions(tmp_path / "pub", publish_every_n_steps=1),
            checkpoint=CheckpointOptions(tmp_path / "ckpt", ckpt_every_n_steps=1),
        )
    served = load_published(tmp_path / "pub")
    assert served["step"] == 1
    assert all(torch.isfinite(v).all() for v in served["network"].values()
               if v.is_floating_point())
    assert latest_checkpoint(tmp_path / "ckpt")[1]["online"]["step"] == 1


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_all_finite_finds_a_bad_value_in_any_chunk(bad, monkeypatch):
    monkeypatch.setattr(guard, "FINITE_CHUNK", 7)  # a table checked 7 values at a time
    t = torch.randn(10, 5)
    assert guard.all_finite(t) and guard.all_finite(t.t())  # contiguous and not
    for at in (0, 6, 7, 49):  # the first, last of a chunk, first of the next, last value
        u = t.clone()
        u.view(-1)[at] = bad
        assert not guard.all_finite(u) and not guard.all_finite(u.t())
    assert guard.all_finite(torch.arange(100))  # integers hold no NaN


def test_finite_values_whose_sum_overflows_are_finite_and_their_step_runs():
    """The fast check sums the values (a sum holding NaN / inf is NaN / inf); a sum that
    overflows (3e38 + 3e38 in float32) is decided by the exact check, not taken as bad."""
    big = torch.tensor([3e38, 3e38, 1.0])
    assert not torch.isfinite(big.sum())  # the fast check alone would be wrong here
    assert guard.all_finite(big) and guard.all_finite(big.to_sparse())
    assert not guard.all_finite(torch.tensor([3e38, 3e38, float("nan")]))
    w = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([w], lr=1e-39)
    g = guard.NonFiniteGuard([opt])
    try:
        w.grad = big.clone()
        opt.step()
        assert g.skipped == 0 and w.abs().sum() > 0  # the step ran
        w.grad = torch.tensor([3e38, float("inf"), 1.0])
        before = w.detach().clone()
        opt.step()
        assert g.skipped == 1 and torch.equal(w.detach(), before)  # skipped, unchanged
    finally:
        g.remove()
