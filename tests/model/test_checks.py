"""Every argument check of docs/semantics.md §1.1 and §1.3 raises MindSpore's exception type."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_amp import LitModel, Model
from lit_amp.callbacks import Callback
from tests.helpers.data import make_batches


def _opt(net):
    return torch.optim.SGD(net.parameters(), lr=0.1)


def test_unknown_kwarg_names_allowed_keys(net):
    with pytest.raises(ValueError, match=r"cast_model_type.*allowed keys.*loss_scale_manager"):
        Model(net, nn.CrossEntropyLoss(), _opt(net), cast_model_type=torch.float16)


@pytest.mark.parametrize("metrics", [["acc"], ("acc",), "acc"])
def test_metrics_must_be_set_or_dict(net, metrics):
    with pytest.raises(TypeError, match="'metrics' must be a set"):
        Model(net, nn.CrossEntropyLoss(), _opt(net), metrics=metrics)


@pytest.mark.parametrize("idx", [[0, 1], [0, 1, "2"], (0, 1, 2), [0, 1, 2, 3]])
def test_eval_indexes_three_ints(net, idx):
    with pytest.raises(ValueError, match="'eval_indexes' must be None or a list of three ints"):
        Model(
            net,
            nn.CrossEntropyLoss(),
            _opt(net),
            metrics={"acc"},
            eval_network=net,
            eval_indexes=idx,
        )


def test_amp_level_without_optimizer(net):
    with pytest.raises(ValueError, match="'optimizer' is None.*amp_level='O2'"):
        Model(net, nn.CrossEntropyLoss(), amp_level="O2")


def test_loss_scale_manager_without_optimizer(net):
    with pytest.raises(ValueError, match="'loss_scale_manager' needs an 'optimizer'"):
        Model(net, nn.CrossEntropyLoss(), loss_scale_manager=object())


def test_metrics_without_loss_or_eval_network(net):
    with pytest.raises(ValueError, match="neither 'eval_network' nor 'loss_fn'"):
        Model(net, metrics={"acc"})


@pytest.mark.parametrize(
    ("kw", "exc", "msg"),
    [
        ({"amp_level": "O4"}, ValueError, "'amp_level' must be one of"),
        ({"amp_level": 2}, TypeError, "'amp_level' must be a str"),
        ({"boost_level": "O3"}, ValueError, "'boost_level' must be one of"),
    ],
)
def test_levels_validated(net, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        Model(net, nn.CrossEntropyLoss(), _opt(net), **kw)


def test_network_must_be_module():
    with pytest.raises(TypeError, match="'network' must be a torch.nn.Module"):
        Model(lambda x: x)


def test_trainer_must_be_dict_without_reserved_keys(net):
    with pytest.raises(TypeError, match="'trainer' must be a dict"):
        Model(net, trainer=["cpu"])
    with pytest.raises(ValueError, match="must not set.*max_epochs"):
        Model(net, trainer={"max_epochs": 3})


def test_boost_without_metrics_is_skipped_with_a_warning(net, batches, caplog):
    model = Model(net, nn.CrossEntropyLoss(), _opt(net), boost_level="O1")
    model.train(1, batches)
    assert "boost_level='O1' is skipped" in caplog.text
    assert not any(type(c).__name__ == "AutoBoost" for c in model.trainer.callbacks)


@pytest.fixture
def model(net):
    return Model(net, nn.CrossEntropyLoss(), _opt(net), metrics={"acc"})


def test_initial_epoch_must_be_below_epoch(model, batches):
    with pytest.raises(ValueError, match="'initial_epoch' must be less than 'epoch'.*3.*3"):
        model.train(3, batches, initial_epoch=3)


@pytest.mark.parametrize("sink_size", [0, -2])
def test_sink_size_values(model, batches, sink_size):
    with pytest.raises(
        ValueError, match=f"'sink_size' must be -1 or a positive int, but got {sink_size}"
    ):
        model.train(1, batches, dataset_sink_mode=True, sink_size=sink_size)


@pytest.mark.parametrize(
    ("kw", "exc", "msg"),
    [
        ({"epoch": -1}, ValueError, "'epoch' must be an int >= 0"),
        ({"epoch": 1.5}, TypeError, "'epoch' must be an int"),
        ({"dataset_sink_mode": 1}, TypeError, "'dataset_sink_mode' must be a bool"),
        ({"sink_size": "3"}, TypeError, "'sink_size' must be an int"),
    ],
)
def test_train_argument_types(model, batches, kw, exc, msg):
    args = {"epoch": 1, "train_dataset": batches, **kw}
    with pytest.raises(exc, match=msg):
        model.train(**args)


def test_empty_dataset(model):
    with pytest.raises(ValueError, match="'train_dataset' is empty"):
        model.train(1, [])


def test_unbounded_dataset_needs_sink_size(model):
    def gen():
        while True:
            yield make_batches(1)[0]

    class Stream:
        def __iter__(self):
            return gen()

    with pytest.raises(ValueError, match="has no length.*sink_size > 0"):
        model.train(1, Stream())
    with pytest.raises(ValueError, match="has no length"):
        model.train(1, Stream(), dataset_sink_mode=True)  # sink_size=-1 needs a length


def test_batch_of_wrong_length(model):
    data = [(torch.randn(4, 4), torch.zeros(4, dtype=torch.long), torch.zeros(4))]
    with pytest.raises(ValueError, match=r"\(data, label\) pair.*3 element"):
        model.train(1, data)


def test_fit_valid_frequency_type(model, batches):
    with pytest.raises(TypeError, match="'valid_frequency' must be an int or a list"):
        model.fit(1, batches, batches, valid_frequency=(1, 2))


def test_fit_valid_dataset_needs_metrics(net, batches):
    model = Model(net, nn.CrossEntropyLoss(), _opt(net))
    with pytest.raises(ValueError, match="'valid_dataset' needs 'metrics'"):
        model.fit(1, batches, batches)


def test_eval_needs_metrics(net, batches):
    model = Model(net, nn.CrossEntropyLoss(), _opt(net))
    with pytest.raises(ValueError, match="Model.eval needs 'metrics'"):
        model.eval(batches)


class Legacy(Callback):
    def step_end(self, run_context):
        pass


def test_legacy_hooks_fit_raises_train_warns(model, batches, caplog):
    with pytest.raises(ValueError, match="Legacy defines the legacy method"):
        model.fit(1, batches, batches, callbacks=[Legacy()])
    model.train(1, batches, callbacks=[Legacy()])
    assert "legacy method" in caplog.text


def test_callbacks_of_wrong_type(model, batches):
    with pytest.raises(TypeError, match=r"'callbacks\[1\]' must be a lit_amp.callbacks.Callback"):
        model.train(1, batches, callbacks=[Legacy(), object()])


def test_build_errors(model, batches, net):
    with pytest.raises(ValueError, match="cannot both be None"):
        model.build()
    plain = Model(net, nn.CrossEntropyLoss(), _opt(net))
    with pytest.raises(RuntimeError, match="'valid_dataset' needs the Model to have 'metrics'"):
        plain.build(valid_dataset=batches)
    model.build(batches, batches)  # warms up without error


def test_layout_outside_sharded_strategy(model, batches):
    with pytest.raises(RuntimeError, match="need a sharded strategy"):
        model.infer_train_layout(batches)
    with pytest.raises(RuntimeError, match="need a sharded strategy"):
        model.infer_predict_layout(batches[0][0])


def test_litmodel_same_checks(net):
    with pytest.raises(ValueError, match="Unsupported keyword"):
        LitModel(net, nn.CrossEntropyLoss(), _opt(net), trainer={})
