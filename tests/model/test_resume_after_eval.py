"""The model-zoo resume pattern: ``Model.train`` with an eval callback and ``ModelCheckpoint``,
then a resume from the files it wrote.

An evaluation from a training callback (``model.eval(ds)`` at an epoch end) runs a Trainer of
its own; the checkpoints written after it still hold the training run's epoch, global step and
loops, and a resume -- Lightning's ``Trainer.fit(ckpt_path=)`` or ``Model.train(...,
initial_epoch=)`` after ``load_checkpoint`` -- ends with the uninterrupted run's weights.
"""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_amp import Model, load_checkpoint, load_param_into_net, save_checkpoint
from lit_amp.callbacks import Callback, CheckpointConfig, ModelCheckpoint
from tests.helpers.data import make_batches, make_net

EPOCHS = 4
STEPS = 3  # batches per epoch
NO_POSITION = "holds no training position"


def _data() -> DataLoader:
    x, y = (torch.cat(t) for t in zip(*make_batches(STEPS, batch=8)))
    return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)


def _model(opt_name: str) -> tuple[Model, nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = make_net()
    if opt_name == "adam":
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    model = Model(net, nn.CrossEntropyLoss(), opt, metrics={"acc"},
                  trainer={"accelerator": "cpu"})
    return model, net, opt


class EvalCallBack(Callback):
    """The model zoo's ``EvalCallBack``: ``model.eval`` every ``interval`` epochs."""

    def __init__(self, model: Model, dataset, interval: int = 2) -> None:
        self.model, self.dataset, self.interval = model, dataset, interval
        self.results: list[dict] = []

    def on_train_epoch_end(self, run_context) -> None:
        if run_context.original_args().cur_epoch_num % self.interval == 0:
            self.results.append(self.model.eval(self.dataset))


def _checkpoints(tmp_path, name: str) -> ModelCheckpoint:
    config = CheckpointConfig(save_checkpoint_steps=STEPS, keep_checkpoint_max=EPOCHS,
                              append_info=["epoch_num", "step_num"])
    return ModelCheckpoint(name, str(tmp_path / name), config)


def _train(tmp_path, name: str, opt_name: str, *, with_eval: bool, sink: bool = False):
    model, net, _ = _model(opt_name)
    callbacks: list = [_checkpoints(tmp_path, name)]
    if with_eval:
        callbacks.insert(0, EvalCallBack(model, _data()))
    model.train(EPOCHS, _data(), callbacks=callbacks, dataset_sink_mode=sink)
    return model, net, callbacks


def _position(path) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=False)
    return {k: state.get(k) for k in ("epoch", "global_step", "loops")} | {
        "callbacks": sorted(state.get("callbacks", {}))}


def _equal_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("sink", [False, True], ids=["steps", "sink"])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_an_eval_callback_leaves_the_checkpoints_training_position(tmp_path, opt_name, sink):
    _, ref_net, _ = _train(tmp_path, "ref", opt_name, with_eval=False, sink=sink)
    model, net, callbacks = _train(tmp_path, "m", opt_name, with_eval=True, sink=sink)
    assert len(callbacks[0].results) == EPOCHS // 2  # it did evaluate, twice
    assert model.trainer.state.fn == "fit"  # the latest call is the training run
    assert _equal_weights(net, ref_net)  # the evaluations changed nothing of the training
    names = [f"-{e}_{STEPS}.ckpt" for e in range(1, EPOCHS + 1)]
    for i, suffix in enumerate(names):
        ref, got = _position(tmp_path / "ref" / f"ref{suffix}"), _position(
            tmp_path / "m" / f"m{suffix}")
        assert got["loops"] is not None, suffix
        assert (got["epoch"], got["global_step"]) == (i, (i + 1) * STEPS), suffix
        assert got == ref, suffix


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_trainer_fit_resumes_a_checkpoint_written_after_an_eval(tmp_path, opt_name):
    _, ref_net, _ = _train(tmp_path, "ref", opt_name, with_eval=False)
    _train(tmp_path, "m", opt_name, with_eval=True)
    resumed, net, _ = _model(opt_name)
    trainer = L.Trainer(max_epochs=EPOCHS, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(resumed.lit_model, train_dataloaders=_data(),
                    ckpt_path=str(tmp_path / "m" / f"m-3_{STEPS}.ckpt"))
    assert not [w for w in caught if NO_POSITION in str(w.message)]
    assert trainer.global_step == EPOCHS * STEPS  # epoch 4 only: not from epoch 0 again
    assert _equal_weights(net, ref_net)


@pytest.mark.parametrize("sink", [False, True], ids=["steps", "sink"])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_model_train_resumes_from_initial_epoch_after_an_eval(tmp_path, opt_name, sink):
    _, ref_net, _ = _train(tmp_path, "ref", opt_name, with_eval=False, sink=sink)
    _train(tmp_path, "m", opt_name, with_eval=True, sink=sink)
    # the model zoo's resume: load the file, continue after the epochs it holds
    resumed, net, opt = _model(opt_name)
    param_dict = load_checkpoint(str(tmp_path / "m" / f"m-2_{STEPS}.ckpt"))
    load_param_into_net(net, param_dict)
    opt.load_state_dict(param_dict["optimizer"])
    initial_epoch = param_dict["append_info"]["epoch_num"]
    assert initial_epoch == 2 and param_dict["global_step"] == 2 * STEPS
    eval_cb = EvalCallBack(resumed, _data())
    resumed.train(EPOCHS, _data(), callbacks=[eval_cb, _checkpoints(tmp_path, "r")],
                  dataset_sink_mode=sink, initial_epoch=initial_epoch)
    assert _equal_weights(net, ref_net)
    # the resumed run's files count on from the loaded position, after its eval too
    assert _position(tmp_path / "r" / f"r-4_{STEPS}.ckpt") == _position(
        tmp_path / "ref" / f"ref-4_{STEPS}.ckpt")


def test_a_resume_from_a_file_without_a_training_position_warns_naming_it(tmp_path):
    model, _, _ = _model("sgd")
    model.train(1, _data())
    path = save_checkpoint(model.lit_model, str(tmp_path / "idle.ckpt"))  # outside training
    assert "loops" not in torch.load(path, weights_only=False)
    resumed, _, _ = _model("sgd")
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path))
    with pytest.warns(UserWarning, match=NO_POSITION) as caught:
        trainer.fit(resumed.lit_model, train_dataloaders=_data(), ckpt_path=path)
    assert any(path in str(w.message) for w in caught if NO_POSITION in str(w.message))


def test_thor_with_a_per_step_lr_array_resumes_at_its_step(tmp_path):
    from lit_amp.thor import thor

    lrs = torch.linspace(0.1, 0.01, EPOCHS * STEPS)  # MindSpore's per-step learning rates

    def build():
        torch.manual_seed(0)
        net = make_net()
        opt = thor(net, lrs, 0.03, 0.9, frequency=2)
        return Model(net, nn.CrossEntropyLoss(), opt, metrics={"acc"},
                     trainer={"accelerator": "cpu"}), net, opt

    ref, ref_net, _ = build()
    ref.train(EPOCHS, _data())
    model, _, _ = build()
    model.train(EPOCHS, _data(), callbacks=[EvalCallBack(model, _data()),
                                            _checkpoints(tmp_path, "t")])
    resumed, net, opt = build()
    param_dict = load_checkpoint(str(tmp_path / "t" / f"t-2_{STEPS}.ckpt"))
    load_param_into_net(net, param_dict)
    opt.load_state_dict(param_dict["optimizer"])
    assert opt.steps == 2 * STEPS and opt.current_lr() == pytest.approx(float(lrs[2 * STEPS]))
    resumed.train(EPOCHS, _data(), initial_epoch=param_dict["append_info"]["epoch_num"])
    assert _equal_weights(net, ref_net)


class _LrLog(Callback):
    """The learning rate of each step, by its step of the whole run (THOR writes the step's rate
    into its param group; a resumed run's ``cur_step_num`` starts at 1 again, as MindSpore's)."""

    def __init__(self, opt) -> None:
        self.opt, self.lr = opt, {}

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        step = (cb.cur_epoch_num - 1) * STEPS + (cb.cur_step_num - 1) % STEPS + 1
        self.lr[step] = self.opt.param_groups[0]["lr"]


@pytest.mark.parametrize("load", ["load_param_into_net", "load_state_dict", "network_only"])
def test_thor_with_an_lr_array_cut_at_the_resume_point_takes_the_uninterrupted_runs_lr(
        tmp_path, load):
    """The model zoo builds ``get_thor_lr(start_epoch * steps, ...)``: the array from the resume
    point on. With THOR's restored step counter each step still takes the uninterrupted run's
    rate (issue #51: the counter indexed the cut array, applying the offset twice)."""
    from lit_amp.thor import get_thor_damping, get_thor_lr, thor

    def build(global_step: int):
        torch.manual_seed(0)
        net = make_net()
        lr = get_thor_lr(global_step, 0.1, 2.0, EPOCHS + 1, STEPS, decay_epochs=3)
        damping = get_thor_damping(global_step, 0.03, 0.5, EPOCHS + 1, STEPS)
        opt = thor(net, lr, damping, 0.9, frequency=2)
        return Model(net, nn.CrossEntropyLoss(), opt, trainer={"accelerator": "cpu"}), net, opt

    ref, ref_net, ref_opt = build(0)
    ref_log = _LrLog(ref_opt)
    ref.train(EPOCHS, _data(), callbacks=[ref_log, _checkpoints(tmp_path, "t")])
    param_dict = load_checkpoint(str(tmp_path / "t" / f"t-2_{STEPS}.ckpt"))
    start_epoch = int(param_dict["epoch_num"])  # MindSpore's key
    resumed, net, opt = build(start_epoch * STEPS)
    load_param_into_net(net, param_dict)
    if load == "load_param_into_net":
        assert load_param_into_net(opt, param_dict) == ([], [])
    elif load == "load_state_dict":
        opt.load_state_dict(param_dict["optimizer"])
    log = _LrLog(opt)
    resumed.train(EPOCHS, _data(), callbacks=[log], initial_epoch=start_epoch)
    assert sorted(log.lr) == list(range(start_epoch * STEPS + 1, EPOCHS * STEPS + 1))
    assert log.lr == {step: ref_log.lr[step] for step in log.lr}
    if load != "network_only":  # the whole state: the uninterrupted run's weights too
        assert opt.steps == ref_opt.steps and _equal_weights(net, ref_net)


class _Crash(Callback):
    """Fails the run at the end of ``epoch`` (after the eval callback's evaluation)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        if cb.cur_epoch_num == self.epoch and cb.cur_step_num % STEPS == 1:
            raise RuntimeError("node failure")


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_backup_and_restore_resumes_after_an_eval_with_the_uninterrupted_weights(
        tmp_path, opt_name):
    """The fault-tolerant path: ``BackupAndRestore`` beside an eval callback; a run that fails
    in epoch 3 (after the evaluation at the end of epoch 2) and is started again ends with the
    weights of the run that never failed."""
    from lit_amp.callbacks import BackupAndRestore

    ref, ref_net, _ = _model(opt_name)
    ref.train(EPOCHS, _data(), callbacks=[EvalCallBack(ref, _data()),
                                          BackupAndRestore(str(tmp_path / "ref"))])
    first, _, _ = _model(opt_name)
    with pytest.raises(RuntimeError, match="node failure"):
        first.train(EPOCHS, _data(), callbacks=[EvalCallBack(first, _data()),
                                                BackupAndRestore(str(tmp_path / "b")), _Crash(3)])
    again, net, _ = _model(opt_name)
    evals = EvalCallBack(again, _data())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again.train(EPOCHS, _data(), callbacks=[evals, BackupAndRestore(str(tmp_path / "b"))])
    assert not [w for w in caught if NO_POSITION in str(w.message)]
    assert _equal_weights(net, ref_net)
    assert len(evals.results) == 1  # the resumed run evaluated at the end of epoch 4 only
