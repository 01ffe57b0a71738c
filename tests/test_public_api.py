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

    code = ("import sys, lit_amp.amp.mixed_precision, lit_amp.amp.loss_scale_controller, "
            "lit_amp.thor; print('lightning' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    importlib.invalidate_caches()
