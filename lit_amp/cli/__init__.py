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

def _exit_if_jobs_failed(failed: list[str], results: list[float | None]) -> None:
    """Exit with status 1 after a sweep in which a job failed (its result.json says so)."""
    nans = sum(1 for v in results if isinstance(v, float) and v != v)
    if not failed and not nans:
        return
    which = f": job(s) {', '.join(failed)}" if failed else ""
    print(f"lit-amp: {max(len(failed), nans)} of the sweep's jobs failed{which}; see their "
          "result.json and the sweep's summary.md.", file=sys.stderr, flush=True)
    raise SystemExit(1)


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
            failing run, an untrusted ``_target_``) or when any job of a ``-m`` sweep failed
            (the others still ran and were summarized); status 0 after ``--help``.
    """
    import hydra

    from lit_amp.cli.aliases import check_plugins, rewrite
    from lit_amp.cli.instantiate import check_command_line

    given = argv is not None
    try:
        argv, notes = rewrite(sys.argv[1:] if argv is None else list(argv))
        check_plugins(argv)
        check_command_line(argv)
    except ConfigError as exc:
        print(f"Error in the command line: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    for note in notes:
        print(note, file=sys.stderr)
    results: list[float | None] = []

    def task(cfg: DictConfig) -> float | None:
        from lit_amp.cli.run import run

        # lit_amp's LitModel defines no FLOPs: Lightning's ThroughputMonitor logs samples only
        warnings.filterwarnings("ignore", message="When using the `ThroughputMonitor`")
        value = run(cfg)
        results.append(value)
        return value

    from lit_amp.cli import sweep_summary

    app = hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name=CONFIG_NAME)(task)
    saved = sys.argv
    sys.argv = [saved[0] if saved else "lit-amp", *argv]
    sweep_summary.last_failures.clear()
    try:
        app()
    finally:
        sys.argv = saved
    _exit_if_jobs_failed(list(sweep_summary.last_failures), results)
    if not given:
        return None
    return results[-1] if results else None
