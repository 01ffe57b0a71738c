"""``lit-amp``: the Hydra application that composes lit_amp from its config tree ``conf/``.

``lit-amp`` (also ``python -m lit_amp``) trains the default experiment, MNIST-1D's CNN through
``Model.fit`` (what ``make demo`` runs); every option is a config group of ``conf/``::

    lit-amp                                        # the default experiment
    lit-amp amp=O3 boost=O1 optimizer=thor trainer=ddp_sim
    lit-amp mode=eval ckpt_path=runs/train/<run>/checkpoints/mnist1d_cnn-30_40.ckpt
    lit-amp mode=online experiment=online
    lit-amp -m amp=O0,O1,O2,O3                     # one result.json per run + a summary
    lit-amp --help                                 # the groups and their options

The package, in the order a run goes through it:

- :mod:`~lit_amp.cli.schema` — the typed schema (enums, dataclasses) in Hydra's ConfigStore;
- :mod:`~lit_amp.cli.build` — ``build(cfg)``: data, network, loss, metrics, optimizer (THOR
  from the network), loss-scale manager, callbacks, loggers, Trainer arguments and the
  ``Model`` (``RecModel`` for ``mode=online``, ``ThorModel`` for THOR), every ``_target_``
  through :func:`lit_amp.cli.instantiate.instantiate`;
- :mod:`~lit_amp.cli.run` — ``run(cfg)``: train / evaluate / train online, print a metrics
  table, write ``result.json`` (rank 0), return ``cfg.optimized_metric`` for sweepers;
- :mod:`~lit_amp.cli.launch` — DDP worker processes inside Hydra runs and sweeps;
- :mod:`~lit_amp.cli.sweep_summary` — ``summary.md/.json/.png`` after a ``-m`` sweep.

``conf/`` is package data (``pkg://lit_amp.cli.conf``), so an installed wheel finds it.
Mistakes in the configuration (an unknown option, a value of the wrong type, an argument a
lit_amp class rejects) are reported by Hydra as one message, not a traceback. Importing this
package (and ``lit-amp --help`` / ``--cfg job``) imports neither torch nor Lightning.

Example:
    >>> from lit_amp.cli import CONF_DIR
    >>> (CONF_DIR / "config.yaml").is_file()
    True
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from lit_amp.cli.schema import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["CONF_DIR", "CONFIG_NAME", "CONFIG_PATH", "ConfigError", "main"]

#: The primary config of ``conf/``.
CONFIG_NAME = "config"
#: The config tree ``lit-amp`` composes from (package data of ``lit_amp.cli``).
CONF_DIR: Path = Path(__file__).resolve().parent / "conf"
#: Hydra's search path of that tree (found from an installed wheel, too).
CONFIG_PATH = "pkg://lit_amp.cli.conf"

def main(argv: Sequence[str] | None = None) -> float | None:
    """The ``lit-amp`` command (also ``python -m lit_amp``).

    Args:
        argv: command-line arguments (overrides, ``-m``, ``--cfg job``, ...); None reads
            ``sys.argv`` — the console-script form.

    Returns:
        With ``argv`` given, the optimized metric of the (last) run, e.g. the test accuracy of
        ``main([])``; with ``argv=None`` None, so that the console script's ``sys.exit(main())``
        exits with status 0.

    Raises:
        SystemExit: status 1 when Hydra reports an error (an unknown option, a bad value, a
            failing run), status 0 after ``--help``.
    """
    import hydra

    results: list[float | None] = []

    def task(cfg: DictConfig) -> float | None:
        from lit_amp.cli.run import run

        # lit_amp's LitModel defines no FLOPs: Lightning's ThroughputMonitor logs samples only
        warnings.filterwarnings("ignore", message="When using the `ThroughputMonitor`")
        value = run(cfg)
        results.append(value)
        return value

    app = hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name=CONFIG_NAME)(task)
    saved = sys.argv
    if argv is not None:
        sys.argv = [saved[0] if saved else "lit-amp", *argv]
    try:
        app()
    finally:
        sys.argv = saved
    if argv is None:
        return None
    return results[-1] if results else None
