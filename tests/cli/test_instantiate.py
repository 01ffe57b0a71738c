"""The one instantiate helper (``lit_amp.cli.instantiate``): the ``_target_`` allow-list is
effective on the installed Hydra (1.3, which has none), and Hydra 1.4's whitelist is used when
there is one."""

from __future__ import annotations

import contextlib

import hydra.utils as hu
import pytest

from lit_amp.cli import instantiate as inst
from lit_amp.cli import main
from lit_amp.cli.build import build
from lit_amp.cli.schema import ConfigError
from tests.cli._helpers import compose_cfg


def test_shell_target_on_the_command_line_is_refused_before_anything_runs(tmp_path, capsys):
    marker = tmp_path / "pwned"
    with pytest.raises(SystemExit) as info:
        main(["+callbacks.evil._target_=os.system", f"+callbacks.evil.command='touch {marker}'",
              "debug=fdr", f"hydra.run.dir={tmp_path / 'run'}"])
    assert info.value.code == 1
    assert not marker.exists()
    assert not (tmp_path / "run").exists()  # Hydra never started the job
    assert "'os.system'" in capsys.readouterr().err


def test_hydra_callback_outside_hydras_own_targets_is_refused(tmp_path, capsys):
    marker = tmp_path / "written"  # torch.save passes Hydra's own policy and writes a file
    with pytest.raises(SystemExit):
        main(["+hydra.callbacks.evil._target_=torch.save",
              f"+hydra.callbacks.evil._args_=[[1],'{marker}']", "debug=fdr",
              f"hydra.run.dir={tmp_path / 'run'}"])
    assert not marker.exists()
    assert "'torch.save'" in capsys.readouterr().err


def test_unpickling_loader_under_a_trusted_prefix_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["model.network._target_=torch.load", f"+model.network.f={tmp_path}/x.pt",
              f"hydra.run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert "'torch.load'" in err and "unpickle" in err


def test_untrusted_target_in_a_composed_config_is_refused_by_build(tmp_path):
    cfg = compose_cfg(["model.network._target_=collections.OrderedDict"], tmp_path)
    with pytest.raises(ConfigError, match="not trusted.*extra_trusted_targets"):
        build(cfg)


def test_lit_amp_checkpoint_loader_is_refused_even_when_trusted(tmp_path):
    cfg = compose_cfg(["+callbacks.x._target_=lit_amp.load_checkpoint",
                       "+callbacks.x.ckpt_file_name=x.ckpt", "+callbacks.x.weights_only=false"],
                      tmp_path)
    with pytest.raises(ConfigError, match="refused"):
        build(cfg)


def test_extra_trusted_targets_admit_a_users_own_class(tmp_path):
    cfg = compose_cfg(["model.network._target_=collections.OrderedDict",
                       "extra_trusted_targets=[collections.*]", "~model.network.channels",
                       "~model.network.num_classes", "~model.network.batch_norm"], tmp_path)
    with pytest.raises(Exception) as info:  # builds the OrderedDict, then fails as a network
        build(cfg)
    assert "not trusted" not in str(info.value)


def test_plain_hydra_13_instantiate():
    lin = inst.instantiate({"_target_": "torch.nn.Linear", "in_features": 2, "out_features": 1})
    assert lin.out_features == 1
    assert inst.whitelist_support() is None  # hydra-core 1.3.8 has no whitelist


def test_whitelist_context_is_used_when_hydra_has_one(monkeypatch):
    seen = []

    @contextlib.contextmanager
    def execution_whitelist(patterns):
        seen.append(tuple(patterns))
        yield

    monkeypatch.setattr(hu, "execution_whitelist", execution_whitelist, raising=False)
    assert inst.whitelist_support() == ("context", "execution_whitelist")
    inst.instantiate({"_target_": "torch.nn.Identity"}, trusted=["my_pkg.*"])
    assert seen and "lit_amp.*" in seen[0] and "torch.*" in seen[0] and "my_pkg.*" in seen[0]


def test_whitelist_kwarg_is_used_when_hydra_has_one(monkeypatch):
    calls = {}

    def fake_instantiate(config, *args, _execution_whitelist_=None, **kwargs):
        calls["wl"] = _execution_whitelist_
        return "made"

    monkeypatch.setattr(hu, "instantiate", fake_instantiate)
    monkeypatch.setattr(inst, "_hydra_instantiate", lambda: fake_instantiate)
    assert inst.whitelist_support() == ("kwarg", "_execution_whitelist_")
    assert inst.instantiate({"_target_": "x.Y"}, trusted=["x.*"]) == "made"
    assert "lightning.*" in calls["wl"] and "x.*" in calls["wl"]
