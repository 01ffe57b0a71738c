"""Checkpoint loading (lit_amp.serialization): Lightning checkpoints of a LitModel load.

A Lightning checkpoint names the weights by the LightningModule's attribute path
(``network.0.weight``); the Python API must strip that prefix, and a load that finds none of
the network's parameters must fail loudly rather than leave the random initialisation.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn

from lit_amp import LitModel
from lit_amp.serialization import load_checkpoint, load_param_into_net, save_checkpoint
from tests.helpers.data import make_batches, make_net


def loader(n_batches: int = 4, batch: int = 16) -> torch.utils.data.DataLoader:
    """``make_batches``' data as a DataLoader (Lightning reads a list as several loaders)."""
    xs, ys = zip(*make_batches(n_batches, batch))
    ds = torch.utils.data.TensorDataset(torch.cat(xs), torch.cat(ys))
    return torch.utils.data.DataLoader(ds, batch_size=batch)


def _lightning_ckpt(tmp_path) -> tuple[str, nn.Module]:
    torch.manual_seed(0)
    net = make_net()
    lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.5))
    trainer = L.Trainer(max_epochs=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)
    trainer.fit(lit, loader())
    path = str(tmp_path / "lightning.ckpt")
    trainer.save_checkpoint(path)
    return path, net


def _same(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("strict", [False, True])
def test_load_checkpoint_of_a_lightning_litmodel_loads_the_weights(tmp_path, strict):
    path, trained = _lightning_ckpt(tmp_path)
    fresh = make_net()
    assert not _same(fresh, trained)
    load_checkpoint(path, net=fresh, strict_load=strict)
    assert _same(fresh, trained)
    x = make_batches(1)[0][0]
    assert torch.equal(fresh(x), trained(x))


def test_load_param_into_net_strips_the_lightning_prefix(tmp_path):
    path, trained = _lightning_ckpt(tmp_path)
    fresh = make_net()
    assert load_param_into_net(fresh, load_checkpoint(path)) == ([], [])
    assert _same(fresh, trained)


def test_a_checkpoint_of_another_network_is_a_value_error_naming_file_and_keys(tmp_path):
    path, _ = _lightning_ckpt(tmp_path)
    other = nn.ModuleDict({"conv": nn.Conv1d(1, 2, 3)})
    with pytest.raises(ValueError) as info:
        load_checkpoint(path, net=other, strict_load=False)
    msg = str(info.value)
    assert "lightning.ckpt" in msg and "conv.weight" in msg and "ModuleDict" in msg
    with pytest.raises(ValueError, match="parameter_dict"):
        load_param_into_net(nn.Linear(3, 3), {"a.b": torch.ones(1)})


def test_prefixes_with_different_values_are_refused():
    sd = {"a.weight": torch.ones(1, 2), "a.bias": torch.ones(1),
          "b.weight": torch.zeros(1, 2), "b.bias": torch.zeros(1)}
    with pytest.raises(ValueError, match="several prefixes"):
        load_param_into_net(nn.Linear(2, 1), sd)


def test_lit_amp_checkpoints_and_plain_state_dicts_still_load(tmp_path):
    src, dst = make_net(), make_net()
    path = save_checkpoint(src, str(tmp_path / "own"))
    load_checkpoint(path, net=dst, strict_load=True)
    assert _same(src, dst)
    dst2 = make_net()
    assert load_param_into_net(dst2, src.state_dict(), strict_load=True) == ([], [])
    assert _same(src, dst2)


def test_save_checkpoint_writes_lightnings_dict_with_lit_amp_keys(tmp_path):
    """One format: a plain module's file is a Lightning-shaped dict (state_dict + lit_amp keys)."""
    net = make_net()
    path = save_checkpoint(net, str(tmp_path / "plain"), {"epoch_num": 2})
    raw = torch.load(path, weights_only=True)
    assert set(raw) == {"state_dict", "append_info", "lit_amp_format", "lit_amp_network_prefix"}
    assert raw["lit_amp_format"] == "lit_amp/2" and raw["append_info"] == {"epoch_num": 2}
    assert raw["state_dict"].keys() == net.state_dict().keys()  # the module's own names


def test_a_lit_model_file_outside_a_trainer_resumes_with_lightning(tmp_path):
    """``save_checkpoint(lit_model)`` with no Trainer attached: Lightning's fit resumes it."""
    torch.manual_seed(0)
    net = make_net()
    lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.5,
                                                               momentum=0.9))
    loss = nn.functional.cross_entropy(net(make_batches(1)[0][0]), make_batches(1)[0][1])
    loss.backward()
    lit.optimizer.step()  # momentum buffers exist
    path = save_checkpoint(lit, str(tmp_path / "lit"))
    fresh_net = make_net()
    fresh = LitModel(fresh_net, nn.CrossEntropyLoss(),
                     torch.optim.SGD(fresh_net.parameters(), 0.5, momentum=0.9))
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        limit_train_batches=0)
    trainer.fit(fresh, loader(), ckpt_path=path)
    assert _same(net, fresh_net)
    bufs = [s["momentum_buffer"] for s in fresh.optimizer.state_dict()["state"].values()]
    ref = [s["momentum_buffer"] for s in lit.optimizer.state_dict()["state"].values()]
    assert len(bufs) == 4 and all(torch.equal(a, b) for a, b in zip(bufs, ref))


def test_a_partial_non_strict_load_warns_naming_the_missing_keys(tmp_path, caplog):
    """MindSpore's strict_load=False loads what matches, and says what did not."""
    net = nn.Linear(2, 1)
    path = save_checkpoint({"weight": torch.ones(1, 2)}, str(tmp_path / "w"))
    with caplog.at_level("WARNING", logger="lit_amp.serialization"):
        load_checkpoint(path, net=net)
    assert "bias" in caplog.text and "strict_load=True" in caplog.text
    with pytest.raises(RuntimeError, match="(?s)w.ckpt.*Missing key"):
        load_checkpoint(path, net=nn.Linear(2, 1), strict_load=True)


def test_checkpoint_state_of_another_shape_is_refused_before_writing(tmp_path):
    """An object's ``checkpoint_state()`` must return Lightning's dict; another shape would
    write a file no reader understands, so ``save_checkpoint`` refuses it and writes nothing."""

    class OldShape:
        def checkpoint_state(self):
            return {"network": {"w": torch.ones(1)}}

    with pytest.raises(TypeError, match=r"checkpoint_state\(\) must return .*'state_dict'"):
        save_checkpoint(OldShape(), str(tmp_path / "x"))
    assert list(tmp_path.iterdir()) == []


def _model_zoo_ckpt(tmp_path, append_info=("epoch_num", "step_num")):
    """A ``Model.train`` run with ``ModelCheckpoint`` (2 epochs of 4 steps): the last file."""
    from lit_amp import Model
    from lit_amp.callbacks import CheckpointConfig, ModelCheckpoint

    torch.manual_seed(0)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    config = CheckpointConfig(save_checkpoint_steps=4, append_info=list(append_info))
    mc = ModelCheckpoint("zoo", str(tmp_path / "zoo"), config)
    Model(net, nn.CrossEntropyLoss(), opt, trainer={"accelerator": "cpu"}).train(
        2, loader(), callbacks=[mc])
    return mc.latest_ckpt_file_name, net, opt


def test_append_info_entries_are_top_level_keys_as_in_mindspore(tmp_path):
    path, _, _ = _model_zoo_ckpt(tmp_path, ("epoch_num", "step_num", {"lr": 0.1, "tag": "a"}))
    param_dict = load_checkpoint(path)
    # MindSpore: int(param_dict["epoch_num"]), param_dict.get("step_num")
    assert int(param_dict["epoch_num"]) == 2 and param_dict.get("step_num") == 8
    assert (param_dict["lr"], param_dict["tag"]) == (0.1, "a")
    assert param_dict["append_info"] == {"epoch_num": 2, "step_num": 8, "lr": 0.1, "tag": "a"}
    assert param_dict["epoch"] == 1  # Lightning's own key keeps its meaning


def test_an_append_dict_key_that_names_a_checkpoint_entry_is_refused(tmp_path):
    for key in ("state_dict", "network", "epoch"):
        with pytest.raises(ValueError, match=f"'{key}'"):
            save_checkpoint(make_net(), str(tmp_path / "x"), {key: 1})
    assert not (tmp_path / "x.ckpt").exists()


def test_choice_func_keeps_the_parameters_it_returns_true_for(tmp_path):
    path, trained, _ = _model_zoo_ckpt(tmp_path)
    param_dict = load_checkpoint(path, choice_func=lambda name: name.startswith("0."))
    assert sorted(param_dict["network"]) == ["0.bias", "0.weight"]
    assert sorted(param_dict["state_dict"]) == ["network.0.bias", "network.0.weight"]
    assert "epoch_num" not in param_dict and param_dict["append_info"] == {}  # filtered as well
    fresh = make_net()
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    assert load_param_into_net(fresh, param_dict) == (["2.weight", "2.bias"], [])
    assert torch.equal(fresh[0].weight, trained[0].weight)
    assert torch.equal(fresh[2].weight, before["2.weight"])  # not chosen: not loaded
    kept = load_checkpoint(path, choice_func=lambda name: name == "epoch_num")
    assert kept["epoch_num"] == 2 and "step_num" not in kept


def test_choice_func_errors_match_mindspore(tmp_path):
    path, _, _ = _model_zoo_ckpt(tmp_path)
    with pytest.raises(ValueError, match="choice_func"):
        load_checkpoint(path, choice_func=lambda name: False)  # an empty dict: MindSpore too
    with pytest.raises(TypeError, match="choice_func"):
        load_checkpoint(path, choice_func="0.")


def test_load_param_into_net_returns_param_not_load_and_ckpt_not_load():
    sd = {"weight": torch.ones(1, 2), "extra": torch.ones(3)}
    assert load_param_into_net(nn.Linear(2, 1), sd) == (["bias"], ["extra"])


def test_load_param_into_net_restores_an_optimizers_state(tmp_path):
    path, net, opt = _model_zoo_ckpt(tmp_path)
    param_dict = load_checkpoint(path)
    fresh = make_net()
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    assert load_param_into_net(fresh, param_dict) == ([], [])
    assert load_param_into_net(fresh_opt, param_dict) == ([], [])  # MindSpore's way
    for p, q in zip(opt.param_groups[0]["params"], fresh_opt.param_groups[0]["params"]):
        assert torch.equal(opt.state[p]["momentum_buffer"], fresh_opt.state[q]["momentum_buffer"])
    with pytest.raises(ValueError, match="no optimizer state"):
        load_param_into_net(fresh_opt, load_checkpoint(save_checkpoint(net, str(tmp_path / "n"))))
