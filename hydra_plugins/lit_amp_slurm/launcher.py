"""``LitAmpSlurmLauncher``: hydra-submitit-launcher's ``SlurmLauncher`` with lit_amp's checks,
bounded watch and signal handling, and its config node ``hydra/launcher/lit_amp_submitit_slurm``.

Example:
    >>> from hydra.core.config_store import ConfigStore
    >>> "lit_amp_submitit_slurm.yaml" in ConfigStore.instance().list("hydra/launcher")
    True
"""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore

try:
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
except ImportError:  # lit_amp[slurm] is not installed: no launcher to register
    SlurmLauncher = None

if SlurmLauncher is not None:

    @dataclass
    class LitAmpSlurmConf(SlurmQueueConf):
        """hydra-submitit-launcher's SLURM options plus ``max_pending_min``: a job pending
        longer than this many minutes is cancelled and the sweep fails (None: no bound)."""

        _target_: str = "hydra_plugins.lit_amp_slurm.launcher.LitAmpSlurmLauncher"
        max_pending_min: Any = 60.0

    class LitAmpSlurmLauncher(SlurmLauncher):
        """Submits each job of a sweep as a SLURM job (see :mod:`lit_amp.cli.slurm`)."""

        def __init__(self, **params: Any) -> None:
            self.max_pending_min = params.pop("max_pending_min", None)
            super().__init__(**params)

        def launch(self, job_overrides: Any, initial_job_idx: int) -> Any:
            """Check the request against the cluster, submit, watch, return the results."""
            from lit_amp.cli.slurm import launch

            return launch(self, job_overrides, initial_job_idx)

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            """One SLURM task of a job: run it, stopping at a step boundary on a signal; its
            config is checked against the submitting command line's grants."""
            from lit_amp.cli.preemption import run_task
            from lit_amp.cli.trust import Grants, guard_composition

            with guard_composition(getattr(self, "grants", None) or Grants()):
                return run_task(super().__call__, *args, **kwargs)

    ConfigStore.instance().store(group="hydra/launcher", name="lit_amp_submitit_slurm",
                                 node=LitAmpSlurmConf, provider="lit_amp")
