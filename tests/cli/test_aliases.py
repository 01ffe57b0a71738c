"""The template's keys on ``lit-amp``'s command line (``lit_amp.cli.aliases``): an alias is
rewritten and said, a key without an equivalent names the one to use, a missing plugin its extra."""

from __future__ import annotations

import json

import pytest
import torch

from lit_amp.cli import main
from tests.cli._helpers import FAST, FAST_DATA, has_module

DATA = [*FAST_DATA, *FAST]


def _epochs_trained(run) -> int:
    ckpt = json.loads((run / "result.json").read_text())["latest_ckpt"]
    return int(torch.load(ckpt, weights_only=True)["append_info"]["epoch_num"])


@pytest.mark.parametrize("key", ["trainer.max_epochs", "+trainer.max_epochs"])
def test_template_max_epochs_is_an_alias_of_epochs(key, tmp_path, capsys):
    main([f"{key}=2", "valid_frequency=1", "logger=none", *DATA, f"hydra.run.dir={tmp_path}"])
    assert _epochs_trained(tmp_path) == 2
    assert "trainer.max_epochs is lit-amp's epochs" in capsys.readouterr().err


@pytest.mark.parametrize(("override", "names"), [
    ("trainer.precision=bf16-mixed", "amp=O0"),
    ("trainer.max_steps=5", "trainer.limit_train_batches"),
])
def test_template_keys_without_an_equivalent_name_the_key_to_use(override, names, tmp_path,
                                                                  capsys):
    with pytest.raises(SystemExit) as info:
        main([override, *DATA, f"hydra.run.dir={tmp_path}"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert override.split("=")[0] in err and names in err


@pytest.mark.parametrize(("option", "extra", "module"), [
    ("hparams_search=optuna", "optuna", "hydra_plugins.hydra_optuna_sweeper"),
    ("hydra/launcher=slurm", "slurm", "hydra_plugins.hydra_submitit_launcher"),
    ("logger=tensorboard", "tensorboard", "tensorboard"),
    ("logger=wandb", "wandb", "wandb"),
])
def test_missing_plugin_names_the_extra(option, extra, module, tmp_path, capsys):
    if has_module(module) or (module == "tensorboard" and has_module("tensorboardX")):
        pytest.skip(f"{module} is installed")
    args = ["-m", option] if "launcher" in option else [option]
    with pytest.raises(SystemExit) as info:
        main([*args, *DATA, f"hydra.run.dir={tmp_path}"])
    assert info.value.code == 1
    assert f"pip install 'lit_amp[{extra}]'" in capsys.readouterr().err
