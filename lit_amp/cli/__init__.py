"""``lit-amp``: the Hydra application (:mod:`~lit_amp.cli.app`) and its config tree ``conf/``.

Names are imported lazily (PEP 562); importing the package imports neither torch nor
Lightning.

Example:
    >>> from lit_amp.cli import CONF_DIR
    >>> (CONF_DIR / "config.yaml").is_file()
    True
"""

from __future__ import annotations

from lit_amp._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "main": "lit_amp.cli.app",
    "CONF_DIR": "lit_amp.cli.schema",
    "CONFIG_NAME": "lit_amp.cli.schema",
    "CONFIG_PATH": "lit_amp.cli.schema",
    "ConfigError": "lit_amp.cli.schema",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
