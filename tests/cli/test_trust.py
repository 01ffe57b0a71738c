"""The trust boundary (``lit_amp.cli.trust``, docs/security.md): a shared config runs no code.

Each route of issue 46 is a named regression case, run as a user would meet it (``lit-amp`` with
an experiment YAML, a ``hydra.searchpath`` folder or overrides alone): the command exits 1 with
one refusal naming the key, nothing is created, no listener is contacted. A hypothesis generator
then composes routes, interpolation chains and gadgets beyond these cases. The grants (the
command line, ``LIT_AMP_TRUSTED_*``) still work, and the shipped configs pass.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lit_amp.cli import main
from lit_amp.cli.trust import Grants, check_trust
from tests.cli._helpers import compose_cfg

FAST = ["debug=fdr", "data=synthetic", "data.num_train=64", "data.num_valid=32", "epochs=1"]


def _experiment(tmp: Path, body: dict, name: str = "shared") -> list[str]:
    conf = tmp / "conf" / "experiment"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / f"{name}.yaml").write_text("# @package _global_\n" + yaml.safe_dump(body))
    return ["--config-dir", str(tmp / "conf"), f"experiment={name}"]


def _searchpath(tmp: Path, body: dict) -> list[str]:
    """The gadget in a folder that only ``hydra.searchpath`` (set by an override) reaches."""
    other = tmp / "elsewhere"
    (other / "experiment").mkdir(parents=True, exist_ok=True)
    (other / "experiment" / "far.yaml").write_text("# @package _global_\n" + yaml.safe_dump(body))
    return [f"hydra.searchpath=[file://{other}]", "experiment=far"]


def _refused(argv: list[str], tmp: Path, capsys, key: str) -> str:
    """Run lit-amp: exit status 1, one refusal naming ``key``, no marker, no run directory."""
    with pytest.raises(SystemExit) as info:
        main([*argv, *FAST, f"hydra.run.dir={tmp / 'run'}"])
    err = capsys.readouterr().err
    assert info.value.code == 1, err
    assert sorted(p.name for p in tmp.rglob("marker*")) == []
    assert not (tmp / "run").exists(), "refused after the job started"
    assert key in err and "lit-amp:" in err, err
    assert "Traceback" not in err
    return err


def _spawn(marker: Path) -> dict:
    return {"()": "distutils.spawn.spawn", "cmd": ["touch", str(marker)]}


@pytest.fixture
def box(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LIT_AMP_TRUSTED_TARGETS", raising=False)
    return tmp_path


# --- 1. late-resolved logging factories ------------------------------------------------------


@pytest.mark.parametrize("holder", ["callbacks", "logger"])
def test_a_logging_handler_resolved_late_from_a_job_node_is_refused(box, capsys, holder):
    body = {holder: {"lit_amp": _spawn(box / "marker")},
            "hydra": {"job_logging": {"handlers": {"evil": f"${{{holder}.${{hydra:job.name}}}}"},
                                      "root": {"handlers": ["evil"]}}}}
    err = _refused(_experiment(box, body), box, capsys, f"{holder}.lit_amp.()")
    assert "logging factory" in err


def test_the_late_logging_factory_is_refused_from_overrides_alone(box, capsys):
    argv = ["+callbacks.x.class=subprocess.Popen", f"+callbacks.x.args=[touch,'{box}/marker']",
            "+hydra.job_logging.handlers.evil=${callbacks.x}",
            "hydra.job_logging.root.handlers=[evil]"]
    err = _refused(argv, box, capsys, "hydra.job_logging.handlers.evil.class")
    assert "'subprocess.Popen'" in err


def test_the_late_logging_factory_is_refused_through_hydra_searchpath(box, capsys):
    body = {"callbacks": {"lit_amp": _spawn(box / "marker")},
            "hydra": {"job_logging": {"handlers": {"evil": "${callbacks.${hydra:job.name}}"}}}}
    _refused(_searchpath(box, body), box, capsys, "callbacks.lit_amp.()")


def test_a_logging_factory_that_is_not_a_handler_is_refused_inside_hydra_logging(box, capsys):
    body = {"hydra": {"hydra_logging": {"handlers": {"evil": _spawn(box / "marker")},
                                        "root": {"handlers": ["evil"]}}}}
    err = _refused(_experiment(box, body), box, capsys, "hydra.hydra_logging.handlers.evil.()")
    assert "'distutils.spawn.spawn'" in err


@pytest.mark.parametrize("value", ["cfg://formatters.simple.format", "ext://os.system"])
def test_cfg_and_ext_references_in_a_logging_config_are_refused(box, capsys, value):
    body = {"hydra": {"job_logging": {"handlers": {"console": {"class": value}}}}}
    _refused(_experiment(box, body), box, capsys, "hydra.job_logging.handlers.console.class")


def test_the_dot_key_cannot_set_attributes_on_a_handler(box, capsys):
    body = {"hydra": {"job_logging": {"handlers": {"console": {
        "class": "logging.StreamHandler", ".": {"baseFilename": str(box / "marker")}}}}}}
    _refused(_experiment(box, body), box, capsys, "hydra.job_logging.handlers.console..")


# --- 2. env_set ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["PYTHONWARNINGS", "BROWSER", "PERL5OPT", "PYTHONPATH",
                                  "LD_PRELOAD", "PYTHONSTARTUP", "PATH", "NCCL_NET_PLUGIN",
                                  "CUDA_INJECTION64_PATH"])
def test_env_set_of_a_variable_that_runs_code_is_refused(box, capsys, name):
    body = {"hydra": {"job": {"env_set": {name: f"touch {box / 'marker'}"}}}}
    _refused([*_experiment(box, body), "trainer=ddp_sim"], box, capsys,
             f"hydra.job.env_set.{name}")


def test_env_copy_is_checked_like_env_set(box, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONSTARTUP", str(box / "x.py"))
    _refused(_experiment(box, {"hydra": {"job": {"env_copy": ["PYTHONSTARTUP"]}}}), box, capsys,
             "hydra.job.env_set.PYTHONSTARTUP")


# --- 3. files of chosen content --------------------------------------------------------------


@pytest.mark.parametrize("where", ["outside", "inside_as_pth"])
def test_a_log_file_outside_the_run_directory_or_not_a_log_is_refused(box, capsys, where):
    name = (str(box / "site" / "evil.log") if where == "outside"
            else "${hydra:runtime.output_dir}/x.pth")
    body = {"hydra": {"job_logging": {
        "formatters": {"simple": {"format": "import os; os.system('touch marker')"}},
        "handlers": {"file": {"filename": name}}}}}
    _refused(_experiment(box, body), box, capsys, "hydra.job_logging.handlers.file.filename")
    assert not (box / "site").exists()


def test_hydra_output_subdir_cannot_leave_the_run_directory(box, capsys):
    _refused(_experiment(box, {"hydra": {"output_subdir": "../../escaped"}}), box, capsys,
             "hydra.output_subdir")


# --- 4. trust grants only from the command line ----------------------------------------------


@pytest.mark.parametrize("key", ["extra_trusted_targets", "trusted_hosts", "trusted_env"])
def test_a_trust_grant_inside_a_yaml_is_refused(box, capsys, key):
    value = {"extra_trusted_targets": ["torch.utils.collect_env.*", "distutils.*"],
             "trusted_hosts": ["evil.example"], "trusted_env": ["AWS_SECRET_ACCESS_KEY"]}[key]
    err = _refused(_experiment(box, {key: value}), box, capsys, key)
    assert "command line" in err


def test_a_grant_in_the_shell_does_not_let_a_yaml_widen_it(box, capsys, monkeypatch):
    monkeypatch.setenv("LIT_AMP_TRUSTED_TARGETS", "tests.*")
    argv = _experiment(box, {"extra_trusted_targets": ["tests.*", "distutils.*"]})
    err = _refused(argv, box, capsys, "extra_trusted_targets")
    assert "['distutils.*']" in err


def test_the_denied_families_stay_refused_when_granted(box, capsys):
    argv = ["+extra_trusted_targets=[torch.utils.collect_env.*]",
            "+callbacks.x._target_=torch.utils.collect_env.run", "+callbacks.x.command=id"]
    with pytest.raises(SystemExit):
        main([*argv, *FAST, f"hydra.run.dir={box / 'run'}"])
    assert "collect_env" in capsys.readouterr().err


# --- 5. secrets to another host --------------------------------------------------------------


@pytest.fixture
def listener():
    """A TCP listener on this machine that records whether anything connected."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    contacted = threading.Event()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            contacted.set()
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], contacted
    stop.set()
    thread.join(2)
    server.close()


def test_an_http_handler_with_a_secret_in_its_url_is_refused(box, capsys, listener, monkeypatch):
    port, contacted = listener
    monkeypatch.setenv("SOME_SECRET", "hunter2")
    body = {"hydra": {"job_logging": {
        "handlers": {"leak": {"class": "logging.handlers.HTTPHandler",
                              "host": f"127.0.0.1:{port}", "url": "/${oc.env:SOME_SECRET}"}},
        "root": {"handlers": ["leak"]}}}}
    err = _refused(_experiment(box, body), box, capsys, "SOME_SECRET")
    assert not contacted.is_set()
    assert "hunter2" not in err
    body["hydra"]["job_logging"]["handlers"]["leak"]["url"] = "/log"
    _refused(_experiment(box, body, "plain"), box, capsys, "HTTPHandler")
    assert not contacted.is_set()


@pytest.mark.parametrize("node", [
    {"data": {"host": "10.1.2.3"}},
    {"data": {"bootstrap_servers": "localhost:9092,broker.example:9092"}},
    {"logger": {"mlflow": {"_target_": "lightning.pytorch.loggers.MLFlowLogger",
                           "tracking_uri": "http://tracker.example:5000"}}},
])
def test_a_config_reaches_only_this_machine(box, capsys, node):
    _refused(_experiment(box, node), box, capsys, "another host")


def test_a_sweeper_callable_needs_a_grant(tmp_path):
    from lit_amp.cli.schema import ConfigError

    cfg = compose_cfg(["hparams_search=optuna",
                       "+hydra.sweeper.custom_search_space=os.system"], tmp_path)
    with pytest.raises(ConfigError, match=r"custom_search_space.*imports and calls"):
        check_trust(cfg, Grants())


@pytest.mark.parametrize("argv,key", [
    (["+hydra.job.env_set.PYTHONSTARTUP=x.py"], "hydra.job.env_set.PYTHONSTARTUP"),
    (["+hydra.job.env_set.LD_PRELOAD=x.so", "trainer=ddp_sim"], "hydra.job.env_set.LD_PRELOAD"),
    (["hydra.job_logging.handlers.file.filename=${hydra:runtime.cwd}/evil.pth"],
     "hydra.job_logging.handlers.file.filename"),
    (["+hydra.job_logging.handlers.leak.class=logging.handlers.HTTPHandler",
      "+hydra.job_logging.handlers.leak.host=127.0.0.1:9",
      "+hydra.job_logging.handlers.leak.url=/x"],
     "HTTPHandler"),
    (["+tags=[${oc.env:SOME_SECRET,none}]"], "SOME_SECRET"),
    (["+data.host=10.1.2.3"], "another host"),
    (["hydra.output_subdir=../../escaped"], "hydra.output_subdir"),
], ids=["env_set", "env_set_ddp", "log_file", "network_handler", "secret", "host", "subdir"])
def test_the_routes_are_refused_from_overrides_too(box, capsys, argv, key):
    """A command line copied from a shared page is checked like a YAML (only grants are
    taken from it)."""
    _refused(argv, box, capsys, key)


# --- 6. the SLURM launcher's shell lines -----------------------------------------------------


def test_launcher_setup_lines_come_only_from_the_command_line(tmp_path):
    from lit_amp.cli.schema import ConfigError

    cfg = compose_cfg(["hydra/launcher=slurm", "hydra.launcher.setup=[id]"], tmp_path)
    with pytest.raises(ConfigError, match=r"hydra\.launcher\.setup.*command line"):
        check_trust(cfg, Grants())  # as if a YAML had set it
    check_trust(cfg, Grants.from_command_line(["hydra.launcher.setup=[id]"], {}))
    cfg = compose_cfg(["hydra/launcher=slurm", "+hydra.launcher.additional_parameters.x='1\n2'"],
                      tmp_path)
    with pytest.raises(ConfigError, match="line break"):
        check_trust(cfg, Grants())


def test_what_is_checked_is_what_the_job_resolves(tmp_path):
    """A key built from ``${now:...}`` resolves later to the value checked (the cache is
    pinned), so a check at one instant cannot pass a node the job picks at the next."""
    import time

    from lit_amp.cli.trust import resolved_view

    cfg = compose_cfg(["+tags=[${now:%H%M%S%f}]"], tmp_path)
    plain, _ = resolved_view(cfg)
    time.sleep(0.01)
    assert list(cfg.tags) == plain["tags"]


# --- what stays possible ---------------------------------------------------------------------


def test_the_shipped_configs_and_harmless_settings_pass(tmp_path):
    for overrides in (
        [], ["experiment=online"], ["experiment=thor"], ["data=clicks_socket"],
        ["data=clicks_kafka"], ["logger=mlflow"], ["trainer=ddp_sim"],
        ["hydra/launcher=slurm", "trainer.devices=2"], ["hparams_search=optuna"],
        ["+hydra.job.env_set.OMP_NUM_THREADS=1", "+hydra.job.env_set.NCCL_DEBUG=INFO"],
        ["+tags=[${oc.env:USER,me}]"],
    ):
        check_trust(compose_cfg(overrides, tmp_path), Grants())


def test_grants_from_the_command_line_and_the_shell(tmp_path):
    from lit_amp.cli.schema import ConfigError

    cfg = compose_cfg(["data=clicks_kafka", "data.bootstrap_servers=broker.example:9092",
                       "+trusted_hosts=[broker.example]"], tmp_path)
    with pytest.raises(ConfigError, match="trusted_hosts"):
        check_trust(cfg, Grants())
    check_trust(cfg, Grants.from_command_line(["+trusted_hosts=[broker.example]"], {}))
    env = Grants.from_command_line([], {"LIT_AMP_TRUSTED_TARGETS": "my_pkg.*, other.*",
                                        "LIT_AMP_TRUSTED_ENV": "DATA_ROOT"})
    assert env.targets == ("my_pkg.*", "other.*") and env.env == ("DATA_ROOT",)


def test_a_users_own_class_granted_in_the_shell_trains(box, capsys, monkeypatch):
    monkeypatch.setenv("LIT_AMP_TRUSTED_TARGETS", "tests.cli._helpers.*")
    main(["+callbacks.digest._target_=tests.cli._helpers.WeightDigest",
          f"+callbacks.digest.out={box}", *FAST, f"hydra.run.dir={box / 'run'}"])
    assert (box / "weights_rank0.json").exists()


# --- the generator ---------------------------------------------------------------------------

GADGETS = {  # what a route consumes -> the values that would leave ``m`` behind if built
    "logging": [
        lambda m: {"()": "subprocess.call", "args": ["touch", str(m)]},
        lambda m: _spawn(m),
        lambda m: {"class": "subprocess.Popen", "args": ["touch", str(m)]},
        lambda m: {"class": "logging.handlers.SocketHandler", "host": "127.0.0.1", "port": 9},
        lambda m: {"class": "logging.FileHandler", "filename": str(m) + ".pth"},
        lambda m: {"class": "logging.StreamHandler", "stream": "ext://os.sys.stdout"},
    ],
    "target": [
        lambda m: {"_target_": "subprocess.call", "args": ["touch", str(m)]},
        lambda m: {"_target_": "importlib.import_module", "name": "marker_mod"},
        lambda m: {"_target_": "hydra.utils.instantiate", "config": {"_target_": "os.system",
                                                                     "command": f"touch {m}"}},
        lambda m: {"_target_": "torch.save", "obj": 1, "f": str(m)},
    ],
    "env": [lambda m: f"touch {m}", lambda m: str(m)],
    "grant": [lambda m: ["subprocess.*"], lambda m: ["evil_pkg.*"]],
}
ROUTES = {  # the key a gadget lands at -> what it consumes
    "hydra.job_logging.handlers.g": "logging",
    "hydra.hydra_logging.handlers.g": "logging",
    "hydra.job_logging.formatters.g": "logging",
    "hydra.job_logging.filters.g": "logging",
    "hydra.callbacks.g": "target",
    "callbacks.g": "target",
    "logger.g": "target",
    "model.network": "target",
    "hydra.job.env_set.PYTHONSTARTUP": "env",
    "hydra.job.env_set.LD_PRELOAD": "env",
    "hydra.job.env_set.NCCL_NET_PLUGIN": "env",
    "extra_trusted_targets": "grant",
    "trusted_hosts": "grant",
    "trusted_env": "grant",
}


def _nest(body: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        body = body.setdefault(p, {})
    body[leaf] = value


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), route=st.sampled_from(sorted(ROUTES)), depth=st.integers(0, 3),
       dynamic_key=st.booleans(), source=st.sampled_from(["experiment", "searchpath"]))
def test_generated_routes_and_gadgets_are_refused(box, capsys, data, route, depth, dynamic_key,
                                                  source):
    """A gadget reaches its route directly or through a chain of ``depth`` interpolations
    (the chain's first key built with ``${hydra:job.name}`` when ``dynamic_key``), from an
    experiment YAML or a folder reached through ``hydra.searchpath``."""
    for old in box.rglob("*.yaml"):
        old.unlink()
    makers = GADGETS[ROUTES[route]]
    value = makers[data.draw(st.integers(0, len(makers) - 1), label="gadget")](box / "marker")
    body: dict = {}
    _nest(body, "logger.stash.lit_amp" if dynamic_key else "logger.stash.h0", value)
    ref = "${logger.stash.${hydra:job.name}}" if dynamic_key else "${logger.stash.h0}"
    for level in range(1, depth + 1):
        _nest(body, f"logger.stash.h{level}", ref)
        ref = f"${{logger.stash.h{level}}}"
    _nest(body, route, ref if depth or dynamic_key else value)
    argv = _experiment(box, body) if source == "experiment" else _searchpath(box, body)
    with pytest.raises(SystemExit) as info:
        main([*argv, *FAST, f"hydra.run.dir={box / 'run'}"])
    err = capsys.readouterr().err
    assert info.value.code == 1, err
    assert sorted(p.name for p in box.rglob("marker*")) == []
    assert not (box / "run").exists(), err
    assert err.count("lit-amp: ") == 1, err
