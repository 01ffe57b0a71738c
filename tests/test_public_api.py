"""The public names of DESIGN §2 exist and resolve (lazy exports cannot silently break)."""

import ast
import importlib
import inspect
from pathlib import Path

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


ROOT = Path(lit_amp.__file__).resolve().parent
INITS = sorted(ROOT.rglob("__init__.py"))
#: the statements a package ``__init__`` may hold after its docstring: the lazy table
TABLE_NAMES = {"_EXPORTS", "__all__", "__getattr__", "__dir__"}
#: more, per package: the version; the class that makes lit_amp.thor callable (nn.thor)
EXTRA = {"lit_amp": {"__version__"},
         "lit_amp.thor": {"_CallableModule", "sys", "types", "Any", "__name__"}}


def _package(init: Path) -> str:
    return ".".join(init.parent.relative_to(ROOT.parent).parts)


def _bound(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, ast.AnnAssign):
        return {node.target.id}
    if isinstance(node, ast.ClassDef):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return {type(node).__name__}


@pytest.mark.parametrize("init", INITS, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_package_init_is_a_docstring_and_a_lazy_table(init: Path) -> None:
    """One ``__init__`` style: a docstring, then at most a lazy ``{name: module}`` table."""
    tree = ast.parse(init.read_text())
    assert ast.get_docstring(tree), "a package __init__ starts with a docstring"
    allowed = TABLE_NAMES | EXTRA.get(_package(init), set())
    extra = []
    for node in tree.body[1:]:
        if isinstance(node, ast.ImportFrom) and node.module in ("__future__", "lit_amp._lazy"):
            continue
        if not _bound(node) <= allowed:
            extra.append(f"line {node.lineno}: {sorted(_bound(node) - allowed)}")
    assert not extra, "an __init__ holds only a docstring and a lazy _EXPORTS table:\n" + \
        "\n".join(extra)


@pytest.mark.parametrize("package", [_package(p) for p in INITS])
def test_lazy_table_names_the_defining_module(package: str) -> None:
    """Each exported name comes from the module that defines it (no re-export chains)."""
    mod = importlib.import_module(package)
    wrong = []
    for name, module in getattr(mod, "_EXPORTS", {}).items():
        obj = getattr(mod, name)
        defined = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None)
        if (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj)) \
                and defined != module:
            wrong.append(f"{name}: the table says {module}, it is defined in {defined}")
    assert sorted(getattr(mod, "__all__", [])) == sorted(getattr(mod, "_EXPORTS", {}))
    assert not wrong, "\n".join(wrong)
