"""The trust boundary of ``lit-amp``: a config from a file or an override runs no code.

Every config Hydra composes (the run's, a sweep's, each sweep job's) is resolved whole,
``hydra.*`` included, with the values Hydra fills in later standing in, and checked once by
:func:`check_trust` before Hydra configures logging or builds anything from it. What an
untrusted config may do and may not is written out in docs/security.md; the rules here are:
targets and logging factories only from :mod:`lit_amp.cli.allowlist`, log files only inside the
run directory, ``env_set`` only for :data:`SETTABLE_ENV`, environment reads only of
:data:`READABLE_ENV`, network endpoints only on this machine, launcher shell text (``setup``,
``srun_args``) and trust grants only from the command line (:class:`Grants`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import fnmatch
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "CALLABLE_KEYS",
    "GRANT_KEYS",
    "NETWORK_HANDLERS",
    "READABLE_ENV",
    "SETTABLE_ENV",
    "SHELL_KEYS",
    "Grants",
    "check_trust",
    "current_grants",
    "granted",
    "guard_composition",
    "resolved_view",
]

#: Environment variables ``hydra.job.env_set`` (and ``env_copy``) may set for the job and the
#: processes it starts: thread counts and the accelerator libraries' switches (fnmatch).
SETTABLE_ENV: tuple[str, ...] = (
    "CUDA_*", "NCCL_*", "GLOO_*", "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "MKL_*",
    "OPENBLAS_NUM_THREADS", "KMP_AFFINITY", "KMP_BLOCKTIME", "TORCH_*", "PYTORCH_CUDA_ALLOC_CONF",
    "TOKENIZERS_PARALLELISM", "HYDRA_FULL_ERROR", "LIT_AMP_RUN_ID", "LIT_AMP_LOG_DIR",
)
#: Words (``_``-separated parts, by prefix) that make a variable matched by a wildcard of
#: :data:`SETTABLE_ENV` load or run something (a plugin library, a folder searched for code, a
#: command): ``NCCL_NET_PLUGIN``, ``CUDA_INJECTION64_PATH``, ``TORCH_HOME`` are refused.
_LOADING_PARTS = ("PLUGIN", "INJECTION", "PATH", "LIB", "PRELOAD", "DIR", "FILE", "CMD",
                  "EXEC", "SHELL", "SCRIPT", "HOOK", "COMPILER", "CXX", "CC", "HOME", "LOAD")
#: What a config may read with ``${oc.env:...}`` besides :data:`SETTABLE_ENV`: no secret.
READABLE_ENV: tuple[str, ...] = (*SETTABLE_ENV, "SLURM_*", "LIT_AMP_*", "HOME", "USER",
                                 "TMPDIR", "HOSTNAME")
#: logging handlers that reach another host: built only when the command line grants them
#: (``+extra_trusted_targets=[logging.handlers.HTTPHandler]``).
NETWORK_HANDLERS: tuple[str, ...] = (
    "logging.handlers.HTTPHandler", "logging.handlers.SocketHandler",
    "logging.handlers.DatagramHandler", "logging.handlers.SysLogHandler",
    "logging.handlers.SMTPHandler", "logging.handlers.QueueHandler",
    "logging.handlers.QueueListener", "logging.handlers.NTEventLogHandler",
)
#: Launcher keys that hold shell text: only their command-line values are accepted.
SHELL_KEYS: tuple[str, ...] = ("hydra.launcher.setup", "hydra.launcher.srun_args")
#: ``hydra.*`` keys whose value is a dotted name a plugin imports and calls (Optuna's search
#: space extender): only a target the command line grants (``extra_trusted_targets``).
CALLABLE_KEYS: tuple[str, ...] = ("hydra.sweeper.custom_search_space",)
#: The config keys that widen trust: only their command-line values are accepted.
GRANT_KEYS: tuple[str, ...] = ("extra_trusted_targets", "trusted_hosts", "trusted_env")
#: The environment variables that grant the same from the user's shell (comma-separated).
_GRANT_ENV = {"extra_trusted_targets": "LIT_AMP_TRUSTED_TARGETS",
              "trusted_hosts": "LIT_AMP_TRUSTED_HOSTS", "trusted_env": "LIT_AMP_TRUSTED_ENV"}
# keys whose values name a host (a string "host[:port]" or a list or comma list of them)
_HOST_KEYS = frozenset({"host", "hosts", "hostname", "bootstrap_servers", "broker", "brokers",
                        "server", "servers", "address", "mailhost", "master_addr"})
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_LOCAL_SCHEMES = frozenset({"file", "pkg", "structured", "ext"})
_LOOPBACK = re.compile(r"^(localhost|127(\.\d{1,3}){3}|::1|0\.0\.0\.0|)$", re.IGNORECASE)
_LOG_SUFFIX = ".log"
_UNSET = "<set by Hydra when the job starts>"


@dataclasses.dataclass(frozen=True)
class Grants:
    """What the command line (and the user's environment) trusts beyond the allowlist.

    Attributes:
        targets: ``extra_trusted_targets`` patterns (``LIT_AMP_TRUSTED_TARGETS``).
        hosts: hosts a config may reach besides this machine (``LIT_AMP_TRUSTED_HOSTS``).
        env: environment variables a config may read besides :data:`READABLE_ENV`
            (``LIT_AMP_TRUSTED_ENV``).
        shell: the command line's values of :data:`SHELL_KEYS` (key -> value).

    Example:
        >>> g = Grants.from_command_line(["+extra_trusted_targets=[my_pkg.*]", "amp=O2"], {})
        >>> g.targets
        ('my_pkg.*',)
    """

    targets: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    shell: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_command_line(
        cls, argv: Sequence[str], environ: Mapping[str, str] | None = None
    ) -> Grants:
        """The grants of a ``lit-amp`` command line and the environment it runs in."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        environ = os.environ if environ is None else environ
        found: dict[str, list[str]] = {key: [] for key in GRANT_KEYS}
        shell: dict[str, Any] = {}
        overrides = [a for a in argv if "=" in a and not a.startswith("-")]
        parser = OverridesParser.create()
        for arg in overrides:
            key = arg.partition("=")[0].lstrip("+~")
            if key not in found and key not in SHELL_KEYS:
                continue
            try:
                value = parser.parse_override(arg).value()
            except Exception:  # noqa: BLE001 - Hydra reports a malformed override itself
                continue
            if key in SHELL_KEYS:
                shell[key] = _plain(value)
            else:
                values = value if isinstance(value, list) else [value]
                found[key] += [str(v) for v in values if v not in (None, "")]
        for key, var in _GRANT_ENV.items():
            found[key] += [p.strip() for p in environ.get(var, "").split(",") if p.strip()]
        return cls(targets=tuple(dict.fromkeys(found["extra_trusted_targets"])),
                   hosts=tuple(dict.fromkeys(found["trusted_hosts"])),
                   env=tuple(dict.fromkeys(found["trusted_env"])), shell=shell)


_GRANTS: contextvars.ContextVar[Grants | None] = contextvars.ContextVar("lit_amp_grants",
                                                                       default=None)


def current_grants() -> Grants:
    """The grants of the running ``lit-amp`` command (none outside one)."""
    return _GRANTS.get() or Grants()


@contextlib.contextmanager
def granted(grants: Grants) -> Iterator[Grants]:
    """Make ``grants`` the running command's for the block (a SLURM task, ``lit-amp``)."""
    token = _GRANTS.set(grants)
    try:
        yield grants
    finally:
        _GRANTS.reset(token)


def _plain(value: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _error(key: str, what: str, allowed: str) -> Exception:
    from lit_amp.cli.schema import ConfigError

    return ConfigError(f"lit-amp: '{key}' {what}; {allowed} (docs/security.md).")


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


# --- resolving the whole config as the job will see it --------------------------------------


def _stand_ins(view: Any) -> None:
    """Fill what Hydra sets only when a job starts: the job's number and id (a text no key
    can be built from) and its output directory (as ``run_job`` computes it)."""
    from omegaconf import OmegaConf, open_dict

    job = view.hydra.job
    with open_dict(view.hydra):
        job._set_flag("struct", False)
        for key in ("num", "id"):
            if OmegaConf.is_missing(job, key):
                del job[key]
                job[key] = _UNSET
        runtime = view.hydra.runtime
        runtime._set_flag("struct", False)
        if "output_dir" not in runtime or OmegaConf.is_missing(runtime, "output_dir"):
            runtime["output_dir"] = os.path.abspath(str(OmegaConf.select(view, "hydra.run.dir")))


@contextlib.contextmanager
def _env_reads(read: list[str]) -> Iterator[None]:
    """Record the variables ``oc.env`` / ``env`` read while the block resolves."""
    from omegaconf import OmegaConf
    from omegaconf.basecontainer import BaseContainer

    saved = {name: BaseContainer._resolvers.get(name) for name in ("oc.env", "env")}

    def recorder(original: Callable[..., Any]) -> Callable[..., Any]:
        def read_env(key: str, default: Any = "__NO_DEFAULT__", **kw: Any) -> Any:
            read.append(str(key))
            if default == "__NO_DEFAULT__":
                return original(key, **kw) if kw else os.environ[key]
            return os.environ.get(key, default)

        return read_env

    try:
        for name, original in saved.items():
            if original is not None:
                OmegaConf.register_new_resolver(name, recorder(original), replace=True)
        yield
    finally:
        for name, original in saved.items():
            if original is not None:
                BaseContainer._resolvers[name] = original


def resolved_view(cfg: Any) -> tuple[dict, list[str]]:
    """The whole config resolved as the job will see it (a plain dict), and the environment
    variables its interpolations read.

    The resolvers' cache (``${now:...}``, ``${lit_amp.run_id:}``) is copied back into ``cfg``,
    so that what Hydra and the job resolve later is what was checked.

    Raises:
        ConfigError: a value that cannot be resolved before the job starts (an interpolation
            of a missing key, or one built from a value Hydra sets only then), naming its key.
    """
    import copy

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    view = copy.deepcopy(cfg)
    view._set_flag(["struct", "readonly"], [False, False])
    read: list[str] = []
    hydra_config = HydraConfig.instance()
    saved = hydra_config.cfg
    try:
        hydra_config.cfg = view  # ${hydra:...} reads the view
        with _env_reads(read):
            _stand_ins(view)
            _resolve_each(view, "")
            plain = OmegaConf.to_container(view, resolve=True)
    finally:
        hydra_config.cfg = saved
    OmegaConf.copy_cache(from_config=view, to_config=cfg)
    assert isinstance(plain, dict)
    return plain, read


def _resolve_each(node: Any, where: str) -> None:
    """Resolve every value, naming the first key that does not resolve."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    keys = list(node.keys()) if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        if OmegaConf.is_missing(node, key):  # '???': Hydra fills it, or it is an error at use
            continue
        path = f"{where}[{key}]" if isinstance(node, ListConfig) else (
            f"{where}.{key}" if where else str(key))
        try:
            value = node[key]
        except Exception as exc:  # noqa: BLE001 - any resolution error refuses the config
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise _error(path, f"cannot be resolved before the job starts ({type(exc).__name__}:"
                         f" {first})", "a config may interpolate only values known when it is "
                         "composed") from None
        if isinstance(value, (DictConfig, ListConfig)):
            _resolve_each(value, path)


# --- the checks -------------------------------------------------------------------------------


def _check_grants(plain: dict, grants: Grants) -> None:
    given = {"extra_trusted_targets": grants.targets, "trusted_hosts": grants.hosts,
             "trusted_env": grants.env}
    for key in GRANT_KEYS:
        extra = [str(v) for v in (plain.get(key) or []) if str(v) not in given[key]]
        if extra:
            raise _error(key, f"lists {extra} in a config file (or a value the command line did"
                         " not give)", f"grant trust on the command line only: lit-amp "
                         f"'+{key}=[...]' or {_GRANT_ENV[key]}=... in your shell")


def _check_env(hydra: dict, read: list[str], grants: Grants) -> None:
    for name in read:
        if not _matches(name, READABLE_ENV) and name not in grants.env:
            raise _error(f"${{oc.env:{name}}}", "reads an environment variable a config may "
                         "not read (it may hold a secret)", f"a config reads only {READABLE_ENV}"
                         " unless the command line grants it: lit-amp '+trusted_env=[NAME]'")
    env_set = (hydra.get("job") or {}).get("env_set") or {}
    for name, value in env_set.items():
        if not _settable(name):
            raise _error(f"hydra.job.env_set.{name}", "sets a variable that can load or run "
                         "code in the job or the processes it starts",
                         f"env_set may set only {SETTABLE_ENV} (by a wildcard, no name with a "
                         f"word starting {'/'.join(_LOADING_PARTS)})")
        if "\n" in str(value) or "\0" in str(value):
            raise _error(f"hydra.job.env_set.{name}", "holds a line break", "one line only")


def _settable(name: str) -> bool:
    """A name of :data:`SETTABLE_ENV`; one matched by a wildcard holds no loading part."""
    if name in SETTABLE_ENV:
        return True
    parts = name.split("_")
    return _matches(name, SETTABLE_ENV) and not any(
        part.startswith(p) for part in parts for p in _LOADING_PARTS)


def _inside(path: str, root: str) -> bool:
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def _check_logging(node: Any, where: str, roots: Sequence[str], grants: Grants) -> None:
    from lit_amp.cli.instantiate import check_logging_factory

    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{where}.{key}"
            if key == ".":
                raise _error(path, "sets attributes on a logging object",
                             "logging configs may not use the '.' key")
            if key in ("()", "class"):
                if value in NETWORK_HANDLERS and not _matches(value, grants.targets):
                    raise _error(path, f"is {value}, which sends records to another host",
                                 "grant it on the command line: lit-amp "
                                 f"'+extra_trusted_targets=[{value}]'")
                check_logging_factory(value, path, grants.targets)
            elif key == "filename":
                _check_log_file(str(value), path, roots)
            _check_logging(value, path, roots, grants)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_logging(value, f"{where}[{i}]", roots, grants)
    elif isinstance(node, str) and node.startswith(("cfg://", "ext://")):
        if node not in ("ext://sys.stdout", "ext://sys.stderr"):
            raise _error(where, f"is {node!r}", "logging configs may name only "
                         "ext://sys.stdout or ext://sys.stderr (no cfg:// nor other ext://)")


def _check_log_file(name: str, where: str, roots: Sequence[str]) -> None:
    if not name.endswith(_LOG_SUFFIX) or not any(_inside(name, r) for r in roots):
        raise _error(where, f"writes {name!r}", f"a log file is a '{_LOG_SUFFIX}' file inside "
                     f"the run directory ({' or '.join(roots)})")


def _hosts(value: Any) -> list[str]:
    items = value if isinstance(value, list) else str(value).split(",")
    hosts = []
    for item in items:
        text = str(item).strip()
        if _URL.match(text):
            text = urlsplit(text).hostname or ""
        elif text.startswith("["):
            text = text[1:].partition("]")[0]
        elif text.count(":") == 1:
            text = text.partition(":")[0]
        hosts.append(text)
    return hosts


def _check_hosts(node: Any, where: str, grants: Grants) -> None:
    def refuse(path: str, host: str) -> None:
        if not _LOOPBACK.match(host) and host not in grants.hosts:
            raise _error(path, f"reaches {host!r}, another host", "a config reaches only this "
                         "machine unless the command line grants the host: lit-amp "
                         f"'+trusted_hosts=[{host}]'")

    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{where}.{key}" if where else str(key)
            if str(key).lower() in _HOST_KEYS and isinstance(value, (str, list)):
                for host in _hosts(value):
                    refuse(path, host)
            _check_hosts(value, path, grants)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_hosts(value, f"{where}[{i}]", grants)
    elif isinstance(node, str):
        match = _URL.match(node)
        if match and match.group(1).lower() not in _LOCAL_SCHEMES:
            try:
                host = urlsplit(node).hostname or ""
            except ValueError:  # a malformed URL: no host to trust
                host = node
            refuse(where, host)


def _check_launcher(launcher: Any, grants: Grants) -> None:
    if not isinstance(launcher, dict):
        return
    for key, value in launcher.items():
        full = f"hydra.launcher.{key}"
        if full in SHELL_KEYS:
            if value not in (None, [], "") and value != grants.shell.get(full):
                raise _error(full, "holds shell text from a config file",
                             f"give it on the command line: lit-amp '{full}=[...]'")
            continue
        texts = value if isinstance(value, list) else (
            list(value.values()) if isinstance(value, dict) else [value])
        if any("\n" in str(t) or "\r" in str(t) for t in texts):
            raise _error(full, "holds a line break (a line of the job's batch script)",
                         "one line per value")


def _check_no_factories(node: Any, where: str) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{where}.{key}" if where else str(key)
            if key == "()":
                raise _error(path, "is a logging factory outside hydra.job_logging / "
                             "hydra.hydra_logging", "build objects with _target_")
            _check_no_factories(value, path)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_no_factories(value, f"{where}[{i}]")


def check_trust(cfg: Any, grants: Grants | None = None) -> None:
    """Refuse a composed config that steps over the trust boundary (docs/security.md).

    Args:
        cfg: the config as Hydra composed it (``hydra.*`` included).
        grants: what the command line trusts; the running command's by default.

    Raises:
        ConfigError: the first rule broken, naming the key, the route and what is allowed.
    """
    from lit_amp.cli.instantiate import check_targets

    grants = current_grants() if grants is None else grants
    plain, read = resolved_view(cfg)
    hydra = plain.pop("hydra", None) or {}
    _check_grants(plain, grants)
    _check_env(hydra, read, grants)
    for key, node in plain.items():  # by name: composing imports neither torch nor Lightning
        check_targets(node, grants.targets, str(key), resolve=False)
    _check_no_factories(plain, "")
    _check_hosts(plain, "", grants)
    runtime, run, sweep = (hydra.get(k) or {} for k in ("runtime", "run", "sweep"))
    roots = [os.path.abspath(str(r)) for r in (runtime.get("output_dir"), run.get("dir"),
                                               sweep.get("dir")) if r]
    for key in ("job_logging", "hydra_logging"):
        _check_logging(hydra.get(key), f"hydra.{key}", roots, grants)
    others = {k: v for k, v in hydra.items() if k not in ("job_logging", "hydra_logging")}
    check_targets(others, grants.targets, "hydra", scope="hydra")
    _check_no_factories(others, "hydra")
    _check_hosts(others, "hydra", grants)
    _check_launcher(hydra.get("launcher"), grants)
    for key in CALLABLE_KEYS:
        parent, _, leaf = key.removeprefix("hydra.").rpartition(".")
        value = (hydra.get(parent) or {}).get(leaf)
        if value is not None and not _matches(str(value), grants.targets):
            raise _error(key, f"names {value!r}, which the sweeper imports and calls",
                         f"grant your own function on the command line: lit-amp "
                         f"'+extra_trusted_targets=[{value}]'")
    sub = hydra.get("output_subdir")
    if sub is not None and (os.path.isabs(str(sub)) or ".." in Path(str(sub)).parts):
        raise _error("hydra.output_subdir", f"is {sub!r}", "a folder inside the run directory")


@contextlib.contextmanager
def guard_composition(grants: Grants | None = None) -> Iterator[Grants]:
    """Check every config Hydra composes inside the block with :func:`check_trust`.

    Hydra builds ``hydra.callbacks``, its launcher and sweeper and configures logging from the
    composed config before lit_amp's task runs, so ``lit-amp`` wraps Hydra's config loader for
    the duration of the app (and a SLURM task for its job); ``grants`` are the command line's
    (:meth:`Grants.from_command_line`), current for the block.
    """
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from lit_amp.cli.schema import check_request

    original = ConfigLoaderImpl.load_configuration
    original_sweep = ConfigLoaderImpl.load_sweep_config

    def load_configuration(self: Any, *args: Any, **kwargs: Any) -> Any:
        cfg = original(self, *args, **kwargs)
        check_request(cfg)  # hydra/launcher=slurm: trainer.devices=auto as one ConfigError
        check_trust(cfg)
        return cfg

    def load_sweep_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        cfg = original_sweep(self, *args, **kwargs)
        check_trust(cfg)  # again: Hydra gave the job the sweep's resolver cache
        return cfg

    with granted(grants if grants is not None else current_grants()) as active:
        ConfigLoaderImpl.load_configuration = load_configuration
        ConfigLoaderImpl.load_sweep_config = load_sweep_config
        try:
            yield active
        finally:
            ConfigLoaderImpl.load_configuration = original
            ConfigLoaderImpl.load_sweep_config = original_sweep
