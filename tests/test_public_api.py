"""The public names of DESIGN §2 exist and resolve (lazy exports cannot silently break)."""

import importlib

import pytest

import lit_amp
import lit_amp.callbacks

DESIGN_NAMES = [
    "Model", "LitModel", "RecModel", "auto_mixed_precision", "custom_mixed_precision",
    "build_train_network", "get_white_list", "get_black_list", "LossScaleManager",
    "FixedLossScaleManager", "DynamicLossScaleManager", "StaticLossScaler", "DynamicLossScaler",
    "all_finite", "AmpPrecision", "thor", "ConvertModelUtils", "AutoBoost",
]
CALLBACK_NAMES = [
    "Callback", "RunContext", "LossMonitor", "TimeMonitor", "ModelCheckpoint",
    "CheckpointConfig", "EarlyStopping", "ReduceLROnPlateau", "LearningRateScheduler",
    "LambdaCallback", "History", "OnRequestExit", "BackupAndRestore",
]


@pytest.mark.parametrize("name", sorted(set(lit_amp.__all__) | set(DESIGN_NAMES)))
def test_top_level_name_resolves(name):
    assert name in lit_amp.__all__
    assert getattr(lit_amp, name) is not None


@pytest.mark.parametrize("name", CALLBACK_NAMES)
def test_callback_name_resolves(name):
    assert callable(getattr(lit_amp.callbacks, name))


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        lit_amp.Nope  # noqa: B018


def test_amp_package_does_not_import_lightning():
    import subprocess
    import sys

    code = ("import sys, lit_amp.amp.convert, lit_amp.amp.loss_scale.controller, "
            "lit_amp.thor; print('lightning' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    importlib.invalidate_caches()


def test_thor_is_the_callable_subpackage_so_dotted_paths_keep_working():
    """``lit_amp.thor`` (MindSpore's ``nn.thor``) is both callable and the subpackage: after
    ``from lit_amp import thor`` Hydra's ``_target_: lit_amp.thor.thor`` must still resolve."""
    from hydra.utils import get_method
    from torch import nn

    from lit_amp import thor
    from lit_amp.thor import THOR

    assert thor is importlib.import_module("lit_amp.thor")
    opt = thor(nn.Linear(4, 2), 0.1, 0.03, 0.9, frequency=2)
    assert isinstance(opt, THOR)
    optimizer_module = importlib.import_module("lit_amp.thor.optimizer")
    assert get_method("lit_amp.thor.thor") is optimizer_module.thor
    assert get_method("lit_amp.thor.get_thor_lr") is not None
