"""lit_amp's SLURM launcher for Hydra: what ``lit-amp -m hydra/launcher=slurm`` builds.

Hydra builds launchers only from classes under the ``hydra_plugins`` namespace, so the class
and its config schema live here; the work is done in :mod:`lit_amp.cli.slurm` (checks before
submission, the bounded watch of the jobs) and :mod:`lit_amp.cli.preemption` (each SLURM
task: a signal stops training at a step boundary, then the job is requeued or ends). Without
hydra-submitit-launcher (``pip install lit_amp[slurm]``) nothing is registered.
"""
