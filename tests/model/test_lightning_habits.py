"""LitModel keeps Lightning's habits in a plain ``L.Trainer`` (issue #19.5).

Accumulation and clipping flags of the Trainer are honoured by LitModel's manual step (and
checked against a hand-written torch loop), ``trainer.predict`` on an ``(x, y)`` loader feeds
``x`` only, train / val / test values are logged under distinct names, and
``LitModel.load_from_checkpoint`` works with ``network=``.
"""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from lit_amp import LitModel
from lit_amp.amp.loss_scale.managers import FixedLossScaleManager
from tests.helpers.data import make_batches, make_net

LR = 0.5


def _loader(n_batches: int, seed: int = 0, batch: int = 16) -> DataLoader:
    xs, ys = zip(*make_batches(n_batches, batch=batch, seed=seed))
    return DataLoader(TensorDataset(torch.cat(xs), torch.cat(ys)), batch_size=batch)


def _trainer(tmp_path, **kw) -> L.Trainer:
    kw.setdefault("max_epochs", 1)
    return L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=str(tmp_path), **kw)


def _lit(net: nn.Module, **kw) -> LitModel:
    return LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), LR), **kw)


def _reference(net: nn.Module, loader: DataLoader, epochs: int, accumulate: int = 1,
               clip: tuple[str, float] | None = None) -> nn.Module:
    """What Lightning's automatic optimization does: loss / N, step every N and at epoch end."""
    net = copy.deepcopy(net)
    opt = torch.optim.SGD(net.parameters(), LR)
    loss_fn = nn.CrossEntropyLoss()
    n = len(loader)
    for _ in range(epochs):
        opt.zero_grad()
        for i, (x, y) in enumerate(loader):
            (loss_fn(net(x), y) / accumulate).backward()
            if (i + 1) % accumulate == 0 or i + 1 == n:
                if clip is not None and clip[0] == "norm":
                    torch.nn.utils.clip_grad_norm_(net.parameters(), clip[1])
                elif clip is not None:
                    torch.nn.utils.clip_grad_value_(net.parameters(), clip[1])
                opt.step()
                opt.zero_grad()
    return net


def _assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6, msg=name)


def test_accumulate_grad_batches_steps_every_n_batches_and_at_epoch_end(tmp_path):
    torch.manual_seed(0)
    net = make_net()
    ref = _reference(net, _loader(5), epochs=2, accumulate=2)
    trainer = _trainer(tmp_path, max_epochs=2, accumulate_grad_batches=2)
    trainer.fit(_lit(net), _loader(5))
    assert trainer.global_step == 2 * 3  # 5 batches: steps after batches 2, 4 and 5
    _assert_same_weights(net, ref)
    assert trainer.accumulate_grad_batches == 2  # the Trainer's flag is left as it was set


@pytest.mark.parametrize("algorithm,value", [("norm", 0.05), ("value", 0.01)])
def test_gradient_clip_val_clips_like_lightning(tmp_path, algorithm, value):
    torch.manual_seed(0)
    net = make_net()
    ref = _reference(net, _loader(4), epochs=1, clip=(algorithm, value))
    unclipped = _reference(net, _loader(4), epochs=1)
    _trainer(tmp_path, gradient_clip_val=value, gradient_clip_algorithm=algorithm).fit(
        _lit(net), _loader(4))
    _assert_same_weights(net, ref)
    assert not torch.allclose(net[0].weight, unclipped[0].weight)


def test_clipping_happens_after_unscaling_under_loss_scale(tmp_path):
    torch.manual_seed(0)
    net = make_net()
    ref = _reference(net, _loader(4), epochs=1, clip=("norm", 0.05))
    lit = _lit(net, loss_scale_manager=FixedLossScaleManager(1024.0, drop_overflow_update=True))
    _trainer(tmp_path, gradient_clip_val=0.05).fit(lit, _loader(4))
    assert lit.loss_scale is not None and lit.loss_scale.enabled
    _assert_same_weights(net, ref)


def test_an_overflowing_step_is_still_skipped_with_clipping(tmp_path):
    torch.manual_seed(0)
    net = make_net()
    before = copy.deepcopy(net)
    x, y = make_batches(1)[0]
    x[0, 0] = float("inf")  # inf gradients: the step must be skipped, not clipped into NaN
    lit = _lit(net, loss_scale_manager=FixedLossScaleManager(1024.0, drop_overflow_update=True))
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    _trainer(tmp_path, gradient_clip_val=0.05).fit(lit, loader)
    assert lit.loss_scale.skipped_steps == 1
    _assert_same_weights(net, before)


def test_gradient_flags_without_an_optimizer_are_refused(tmp_path):
    net = make_net()
    lit = LitModel(net, nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match="accumulate_grad_batches=2.*optimizer"):
        _trainer(tmp_path, accumulate_grad_batches=2).fit(lit, _loader(2))


def test_predict_on_a_loader_of_pairs_feeds_the_inputs_only(tmp_path):
    torch.manual_seed(0)
    net = make_net()
    loader = _loader(2)
    preds = _trainer(tmp_path).predict(_lit(net), loader)
    x = torch.cat([b[0] for b in loader])
    with torch.no_grad():
        expected = net(x)
    torch.testing.assert_close(torch.cat(preds), expected)


def test_train_val_and_test_values_are_logged_under_distinct_names(tmp_path):
    torch.manual_seed(0)
    net = make_net()
    lit = _lit(net, metrics={"acc", "loss"})
    trainer = _trainer(tmp_path, max_epochs=2)
    trainer.fit(lit, _loader(4), _loader(2, seed=1))
    logged = set(trainer.callback_metrics)
    assert {"train/loss", "val/acc", "val/eval_loss"} <= logged
    # the Loss metric ('loss') is the mean eval loss: logged once, as eval_loss (issue #48)
    assert not logged & {"loss", "acc", "eval_loss", "val/loss"}
    test = trainer.test(lit, _loader(2, seed=2), verbose=False)[0]
    assert set(test) == {"test/acc", "test/eval_loss"}
    assert test["test/eval_loss"] == pytest.approx(lit.last_eval_results["metrics"]["loss"])
    assert test["test/acc"] == pytest.approx(lit.last_eval_results["metrics"]["acc"])


def test_load_from_checkpoint_with_network_restores_the_weights(tmp_path):
    torch.manual_seed(0)
    net = make_net()
    trainer = _trainer(tmp_path, max_epochs=2)
    trainer.fit(_lit(net), _loader(4))
    path = str(tmp_path / "lit.ckpt")
    trainer.save_checkpoint(path)
    fresh = make_net()
    # the loading model may be built without the optimizer, or with metrics the saving one
    # lacked (their cells hold the backbone under other names)
    lit = LitModel.load_from_checkpoint(path, network=fresh, loss_fn=nn.CrossEntropyLoss(),
                                        metrics={"acc"})
    assert lit.network is fresh
    _assert_same_weights(fresh, net)
    x = make_batches(1)[0][0]
    torch.testing.assert_close(lit.eval_network(x, torch.zeros(16, dtype=torch.long))[1], net(x))
    with pytest.raises(TypeError, match="network="):
        LitModel.load_from_checkpoint(path)


def _ddp_worker(rank: int, world: int) -> dict:
    from datetime import timedelta

    from lightning.pytorch.strategies import DDPStrategy

    from lit_amp.callbacks import History, to_lightning

    torch.manual_seed(0)
    net = make_net()
    history = History()
    trainer = L.Trainer(accelerator="cpu", devices=world, logger=False, max_epochs=2,
                        strategy=DDPStrategy(timeout=timedelta(seconds=30)),
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accumulate_grad_batches=2,
                        gradient_clip_val=0.05, callbacks=[to_lightning(history)],
                        use_distributed_sampler=False)
    # each rank reads every other sample: its batch of 8 is half of a global batch of 16
    data = _loader(5).dataset
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
    trainer.fit(_lit(net), DataLoader(data, batch_size=16 // world, sampler=sampler))
    return {"weights": [p.detach().clone() for p in net.state_dict().values()],
            "steps": trainer.global_step, "epochs": history.epoch["epoch"]}


def test_accumulation_and_clipping_under_two_process_ddp_match_one_process():
    from tests.helpers.dist import run_distributed

    torch.manual_seed(0)
    net = make_net()
    ref = _reference(net, _loader(5), epochs=2, accumulate=2, clip=("norm", 0.05))
    for res in run_distributed(_ddp_worker, world=2, init_group=False):
        assert res["steps"] == 2 * 3 and res["epochs"] == [1, 2]
        for got, want in zip(res["weights"], ref.state_dict().values()):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
