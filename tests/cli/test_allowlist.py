"""The ``_target_`` allowlist (``lit_amp.cli.allowlist``) against config gadgets: a shared YAML or
an override cannot make ``lit-amp`` build what it must not.

Each gadget's arguments try to create a marker file (a shell command, a pickle that writes one
when loaded, a module or hub repo that writes one when imported, ...). Through an experiment
YAML, a ``hydra:`` block of one (Hydra builds those itself) and command-line overrides, every
gadget is refused with a message naming it, before any job starts, and no marker exists.
A table and a generated probe of target strings check the allowlist itself.
"""

from __future__ import annotations

import inspect
import itertools
import pickle
from pathlib import Path

import pytest
import yaml

from lit_amp.cli import main
from lit_amp.cli.instantiate import check_targets
from lit_amp.cli.schema import ConfigError


class _Payload:
    """Unpickling it opens (creates) a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _shell(target: str, marker: Path) -> dict:
    return {"_target_": target, "_args_": [["touch", str(marker)]]}


def _instantiate_class(marker: Path) -> dict:
    return {"_target_": "lightning.pytorch.cli.instantiate_class", "_convert_": "all",
            "args": ["touch", str(marker)], "init": {"class_path": "subprocess.call"}}


def _gadgets(tmp: Path) -> dict[str, dict]:
    """name -> config node; the node creates ``tmp/marker_<name>`` if it is ever built."""

    def m(name: str) -> Path:
        return tmp / f"marker_{name}"

    payload = tmp / f"payload_{tmp.name}.pkl"
    payload.write_bytes(pickle.dumps(_Payload(str(m("unpickled")))))
    hub = tmp / "hub"
    hub.mkdir(exist_ok=True)
    (hub / "hubconf.py").write_text(f"open({str(m('hub'))!r}, 'w').close()\ndef m():\n    pass\n")
    (tmp / "gadget_module.py").write_text(f"open({str(m('import'))!r}, 'w').close()\n")
    return {
        "instantiate_class": _instantiate_class(m("instantiate_class")),
        "cloud_io_load": {"_target_": "lightning.fabric.utilities.cloud_io._load",
                          "path_or_url": str(payload), "weights_only": False},
        "torch_load": {"_target_": "torch.load", "f": str(payload), "weights_only": False},
        "lit_amp_load_checkpoint": {"_target_": "lit_amp.load_checkpoint",
                                    "ckpt_file_name": str(payload), "weights_only": False},
        "numpy_load": {"_target_": "numpy.load", "file": str(payload), "allow_pickle": True},
        "pickle_loads": {"_target_": "pickle.loads", "_args_": ["x"]},
        "torch_hub_load": {"_target_": "torch.hub.load", "repo_or_dir": str(hub), "model": "m",
                           "source": "local", "trust_repo": True},
        "import_module": {"_target_": "importlib.import_module", "_args_": ["gadget_module"]},
        "eval": {"_target_": "builtins.eval", "_args_": [f"open({str(m('eval'))!r}, 'w')"]},
        "os_system": {"_target_": "os.system", "_args_": [f"touch {m('os_system')}"]},
        "subprocess_call": _shell("subprocess.call", m("subprocess_call")),
        "subprocess_popen": _shell("subprocess.Popen", m("subprocess_popen")),
        "subprocess_run": _shell("subprocess.run", m("subprocess_run")),
        "torch_save": {"_target_": "torch.save", "obj": 1, "f": str(m("torch_save"))},
        "private_name": {"_target_": "lit_amp._io.atomic_write", "payload": {"a": 1},
                         "ckpt_file_name": str(m("private_name"))},
        "dunder": {"_target_": "torch.nn.Module.__init__", "_args_": [1]},
        "hydra_instantiate": {"_target_": "hydra.utils.instantiate", "_recursive_": False,
                              "config": _instantiate_class(m("hydra_instantiate"))},
        "nested_in_kwargs": {"_target_": "lit_amp.callbacks.LossMonitor",
                             "per_print_times": _instantiate_class(m("nested_in_kwargs"))},
        "nested_in_args": {"_target_": "torch.nn.Sequential",
                           "_args_": [_instantiate_class(m("nested_in_args"))]},
    }


NAMES = [  # the keys of _gadgets (test_names_cover_every_gadget)
    "instantiate_class", "cloud_io_load", "torch_load", "lit_amp_load_checkpoint", "numpy_load",
    "pickle_loads", "torch_hub_load", "import_module", "eval", "os_system", "subprocess_call",
    "subprocess_popen", "subprocess_run", "torch_save", "private_name", "dunder",
    "hydra_instantiate", "nested_in_kwargs", "nested_in_args",
]


def _named(node: dict, err: str) -> bool:
    """The error names a target of the node (the outer one or one nested in its arguments)."""
    values = [*node.values(), *node.get("_args_", [])]
    return repr(node["_target_"]) in err or any(
        _named(v, err) for v in values if isinstance(v, dict) and "_target_" in v)


def _override(value) -> str:
    """A value in Hydra's override grammar (strings quoted)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_override(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_override(v) for v in value) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _run(argv: list[str], tmp: Path, capsys) -> str:
    """Run lit-amp; the gadget created no marker, lit-amp exited 1 and started no job."""
    with pytest.raises(SystemExit) as info:
        main([*argv, "debug=fdr", "data=synthetic", f"hydra.run.dir={tmp / 'run'}"])
    assert sorted(p.name for p in tmp.glob("marker_*")) == []
    assert info.value.code == 1
    assert not (tmp / "run").exists()  # refused before the job started
    return capsys.readouterr().err


def test_names_cover_every_gadget(tmp_path):
    assert list(_gadgets(tmp_path)) == NAMES


@pytest.fixture
def gadget_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))  # gadget_module.py is importable
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _experiment(tmp: Path, body: dict) -> list[str]:
    conf = tmp / "conf" / "experiment"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "gadget.yaml").write_text("# @package _global_\n" + yaml.safe_dump(body))
    return ["--config-dir", str(tmp / "conf"), "experiment=gadget"]


@pytest.mark.parametrize("name", NAMES)
def test_gadget_in_an_experiment_yaml_is_refused(name, gadget_dir, capsys):
    node = _gadgets(gadget_dir)[name]
    err = _run(_experiment(gadget_dir, {"callbacks": {"gadget": node}}), gadget_dir, capsys)
    assert _named(node, err) and "extra_trusted_targets" in err


@pytest.mark.parametrize("name", NAMES)
def test_gadget_on_the_command_line_is_refused(name, gadget_dir, capsys):
    node = _gadgets(gadget_dir)[name]
    argv = [f"+callbacks.gadget.{k}={v if k == '_target_' else _override(v)}"
            for k, v in node.items()]
    err = _run(argv, gadget_dir, capsys)
    assert _named(node, err)


@pytest.mark.parametrize("name", ["instantiate_class", "torch_save", "nested_in_kwargs"])
def test_gadget_as_a_hydra_callback_in_a_yaml_is_refused(name, gadget_dir, capsys):
    node = _gadgets(gadget_dir)[name]  # Hydra builds hydra.callbacks before lit-amp's job
    err = _run(_experiment(gadget_dir, {"hydra": {"callbacks": {"gadget": node}}}),
               gadget_dir, capsys)
    assert _named(node, err)


def test_gadget_as_a_logging_handler_in_a_yaml_is_refused(gadget_dir, capsys):
    handler = _instantiate_class(gadget_dir / "marker_logging")
    handler["()"] = handler.pop("_target_")  # logging.config's factory key
    del handler["_convert_"]
    body = {"hydra": {"hydra_logging": {"handlers": {"gadget": handler},
                                        "root": {"handlers": ["gadget"]}}}}
    err = _run(_experiment(gadget_dir, body), gadget_dir, capsys)
    assert "'lightning.pytorch.cli.instantiate_class'" in err


def test_extra_trusted_targets_cannot_admit_the_shell_nor_everything(gadget_dir, capsys):
    marker = gadget_dir / "marker_x"
    err = _run(["+extra_trusted_targets=[subprocess.*]", "+callbacks.x._target_=subprocess.call",
                f"+callbacks.x._args_=[[touch,'{marker}']]"], gadget_dir, capsys)
    assert "'subprocess.call'" in err and "refused" in err
    with pytest.raises(ConfigError, match=r"'\*'.*package name"):
        check_targets({"_target_": "collections.OrderedDict"}, ["*"])
    with pytest.raises(ConfigError, match="private"):  # lit_amp's private modules stay closed
        check_targets({"_target_": "lit_amp._io.atomic_write"}, ["lit_amp.*"])
    check_targets({"_target_": "tests.cli._helpers.WeightDigest"}, ["tests.*"])  # the user's own


# --- the allowlist itself, on target strings -------------------------------------------------

ALLOWED = [
    "torch.nn.Linear", "torch.nn.modules.linear.Linear", "torch.nn.CrossEntropyLoss",
    "torch.optim.SGD", "torch.optim.Adam", "torch.optim.lr_scheduler.StepLR",
    "torch.optim.lr_scheduler.ReduceLROnPlateau", "torch.tensor", "lightning.pytorch.Trainer",
    "lightning.Trainer", "lightning.pytorch.callbacks.ModelCheckpoint",
    "lightning.pytorch.loggers.CSVLogger", "lightning.pytorch.strategies.DDPStrategy",
    "lightning.pytorch.plugins.TorchCheckpointIO", "lightning.pytorch.profilers.SimpleProfiler",
    "torchmetrics.Accuracy", "torchmetrics.classification.MulticlassAccuracy",
    "lit_amp.callbacks.LossMonitor", "lit_amp.FixedLossScaleManager", "lit_amp.demos.MLP",
    "lit_amp.thor.thor", "lit_amp.thor.get_thor_lr", "lit_amp.demos.synthetic_loaders",
]
REFUSED = [
    "torch.nn.functional.relu", "torch.nn.Linear.forward", "torch.nn.Module.load_state_dict",
    "torch.optim.Optimizer.load_state_dict", "torch.nn.init.normal_", "torch.save",
    "torch.from_file", "torch.ops.aten.add", "torch.utils.data.DataLoader",
    "torchmetrics.functional.accuracy", "lightning.pytorch.Trainer.fit",
    "lightning.pytorch.cli.LightningCLI", "lightning.pytorch.seed_everything",
    "lightning.pytorch.LightningModule.load_from_checkpoint", "lightning.fabric.Fabric",
    "lit_amp.save_checkpoint", "lit_amp.load_param_into_net", "lit_amp.rec.publish_weights",
    "lit_amp.rec.sources.write_shard", "lit_amp.cli.main", "lit_amp.cli.build.build",
    "lit_amp.callbacks", "lit_amp.Model.__init__", "lit_amp.__class__", "collections.OrderedDict",
    "torch", "torch.nn.Linear ", "${oc.env:T}", "os.path.join",
]


def _admitted(target: str) -> bool:
    try:
        check_targets({"_target_": target})
    except ConfigError:
        return False
    return True


def test_table_of_targets():
    assert [t for t in ALLOWED if not _admitted(t)] == []
    assert [t for t in REFUSED if _admitted(t)] == []


def _families():
    import lightning.pytorch as lp
    import torch
    import torchmetrics
    from lightning.pytorch import accelerators, loggers, profilers, strategies
    from lightning.pytorch.plugins import LayerSync
    from lightning.pytorch.plugins.environments import ClusterEnvironment
    from lightning.pytorch.plugins.io import CheckpointIO
    from lightning.pytorch.plugins.precision import Precision

    return (torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler,
            lp.Callback, loggers.Logger, strategies.Strategy, profilers.Profiler,
            accelerators.Accelerator, Precision, CheckpointIO, ClusterEnvironment, LayerSync,
            lp.Trainer, torchmetrics.Metric)


def test_generated_targets_admit_only_classes_of_the_allowed_families():
    import hydra.utils
    import torch

    from lit_amp.demos import mnist1d_loaders, synthetic_loaders
    from lit_amp.thor import get_thor_damping, get_thor_lr, thor

    heads = ["lit_amp", "torch", "lightning", "lightning.pytorch", "torchmetrics", "os",
             "builtins", "subprocess", "numpy", "hydra"]
    middles = ["", "nn", "optim", "optim.lr_scheduler", "cli", "callbacks", "loggers", "hub",
               "utils", "fabric.utilities.cloud_io", "nn.Module", "functional", "_io", "thor",
               "rec", "serialization", "classification", "plugins", "strategies"]
    leaves = ["Linear", "SGD", "StepLR", "load", "_load", "instantiate_class", "__init__",
              "system", "eval", "ModelCheckpoint", "thor", "save", "Accuracy", "Trainer",
              "main", "LossMonitor", "load_checkpoint", "save_checkpoint", "tensor", "call",
              "instantiate", "__class__", "CSVLogger", "DDPStrategy", "publish_weights",
              "get_thor_lr"]
    factories = (thor, get_thor_lr, get_thor_damping, synthetic_loaders, mnist1d_loaders,
                 torch.tensor)
    families = _families()
    admitted = []
    for head, middle, leaf in itertools.product(heads, middles, leaves):
        target = ".".join(p for p in (head, middle, leaf) if p)
        if not _admitted(target):
            continue
        admitted.append(target)
        obj = hydra.utils.get_object(target)
        assert not any(p.startswith("_") for p in target.split(".")), target
        assert target.split(".")[0] in ("lit_amp", "torch", "lightning", "torchmetrics"), target
        assert any(obj is f for f in factories) or (
            inspect.isclass(obj) and (issubclass(obj, families) or target.startswith("lit_amp."))
        ), target
    assert len(admitted) >= 15  # the probe reaches the allowed families at all
