"""The ``lit-amp`` command: the Hydra application that composes lit_amp from ``conf/``.

``lit-amp`` (also ``python -m lit_amp``) trains the default experiment; every option is a
config group (``lit-amp amp=O3 boost=O1 trainer=ddp_sim``, ``lit-amp -m amp=O0,O1,O2,O3``,
``lit-amp --help``). :func:`main` rewrites template keys (:mod:`~lit_amp.cli.aliases`), checks
the command line and every composed config against the trust rules (:mod:`~lit_amp.cli.trust`),
refuses what needs no torch to refuse (:mod:`~lit_amp.cli.precheck`), then runs
(:mod:`~lit_amp.cli.run`). A configuration mistake is one message, not a traceback. The config
tree is package data (:data:`lit_amp.cli.schema.CONF_DIR`). Importing this module (and
``lit-amp --help``) imports neither torch nor Lightning.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from lit_amp.cli.schema import CONFIG_NAME, CONFIG_PATH, ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["main"]


def _exit_if_jobs_failed(failed: list[str], results: list[float | None]) -> None:
    """Exit with status 1 after a sweep in which a job failed (its result.json says so)."""
    nans = sum(1 for v in results if isinstance(v, float) and v != v)
    if not failed and not nans:
        return
    which = f": job(s) {', '.join(failed)}" if failed else ""
    print(f"lit-amp: {max(len(failed), nans)} of the sweep's jobs failed{which}; see their "
          "result.json and the sweep's summary.md.", file=sys.stderr, flush=True)
    raise SystemExit(1)


def _exit_now(code: object) -> None:
    """End the process after an error without tearing the interpreter down.

    What Python does at exit that matters still happens — the threads that are not daemons
    are joined (an asynchronous checkpoint write finishes), the ``atexit`` handlers run
    (logging's files are flushed and closed, worker processes are ended) and standard output
    and error are flushed — but the thousands of modules torch and Lightning imported are not
    finalized one by one, which took longer than the error (docs/benchmarks.md, "Error exit").
    """
    if not isinstance(code, int):
        if code is not None:
            print(code, file=sys.stderr)
        code = 1
    main_thread = threading.main_thread()
    for t in threading.enumerate():
        if t is not main_thread and not t.daemon and t is not threading.current_thread():
            t.join()
    try:
        import atexit

        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(code)


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
            (the others still ran and were summarized); 128 + the signal number (143) when a
            SIGTERM (or Ctrl-C) stopped a ``-m`` sweep (every job's state is summarized;
            ``--resume`` runs the rest); status 0 after ``--help``. The console script
            (``argv=None``) exits at once after an error (see :func:`_exit_now`).
    """
    if argv is not None:
        return _main(list(argv))
    try:
        return _main(None)
    except SystemExit as exc:
        if exc.code in (0, None):
            raise
        _exit_now(exc.code)
        raise  # pragma: no cover - _exit_now does not return


def _main(argv: list[str] | None) -> float | None:
    import hydra

    from lit_amp.cli import sweep_state
    from lit_amp.cli.aliases import check_plugins, rewrite
    from lit_amp.cli.hints import unknown_key_hints
    from lit_amp.cli.instantiate import check_command_line
    from lit_amp.cli.trust import Grants, guard_composition

    given = argv is not None
    try:
        args, resume = sweep_state.take_resume_flag(sys.argv[1:] if argv is None else argv)
        argv, notes = rewrite(args)
        check_plugins(argv)
        grants = Grants.from_command_line(argv)
        check_command_line(argv, grants.targets)
        if resume:
            argv, note = sweep_state.resume_argv(argv)
            notes.append(note)
    except ConfigError as exc:
        print(f"Error in the command line: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    for note in notes:
        print(note, file=sys.stderr)
    results: list[float | None] = []

    def task(cfg: DictConfig) -> float | None:
        done = sweep_state.done_result()
        if done is not None:  # --resume: this job finished before
            print(f"lit-amp: job {' '.join(done.get('overrides') or [])} is done (its "
                  "result.json): not run again", flush=True)
            value = done.get("value")
            value = float(value) if isinstance(value, (int, float)) else None
            results.append(value)
            return value
        try:
            if not sweep_state.in_sweep():
                from lit_amp.cli.aliases import check_packages
                from lit_amp.cli.precheck import check_config

                check_packages(cfg)  # before torch and Lightning are imported
                check_config(cfg)  # data.batch_size=-1, ckpt_path=/nonexistent, ...: likewise
            from lit_amp.cli.console import quiet_warnings
            from lit_amp.cli.run import run

            quiet_warnings()  # Lightning's advice that does not apply to a lit-amp run
            value = run(cfg)
        except sweep_state.SweepInterrupted as exc:
            sweep_state.record_interrupted(cfg, exc)
            raise
        results.append(value)
        return value

    from lit_amp.cli import sweep_summary

    app = hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name=CONFIG_NAME)(task)
    saved = sys.argv
    sys.argv = [saved[0] if saved else "lit-amp", *argv]
    sweep_summary.last_failures.clear()
    sweep_state.resume_active = resume
    sweep_state.current_sweep_dir = None
    try:
        with sweep_state.interruptible(sweep_state.is_multirun(argv)), unknown_key_hints(), \
                guard_composition(grants):  # every composed config, before Hydra builds any
            app()
    except sweep_state.SweepInterrupted as exc:
        raise sweep_summary.interrupted_exit(exc) from None
    finally:
        sys.argv = saved
        sweep_state.resume_active = False
    _exit_if_jobs_failed(list(sweep_summary.last_failures), results)
    if not given:
        return None
    return results[-1] if results else None
