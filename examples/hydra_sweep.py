"""A Hydra sweep of the AMP levels: ``lit-amp -m experiment=sweep_amp amp=O0,O1,O2,O3``.

Each job trains MNIST-1D's CNN (with BatchNorm) for 5 epochs at one AMP level and writes its
``result.json``; when the sweep ends, ``summary.md`` (accuracy, throughput, wall time per level)
and ``summary.png`` / ``curves.png`` (learning curves from each job's metrics.csv; needs
``lit_amp[plot]``) appear in the sweep directory, and the table is printed. A sweep in which a
job failed exits with status 1. The same from the shell::

    lit-amp -m experiment=sweep_amp amp=O0,O1,O2,O3
    lit-amp -m experiment=sweep_amp amp=O0,O2 seed=0,1,2     # + mean ± std over the seeds
    lit-amp -m experiment=sweep_amp amp=O2,O3 loss_scale=none,dynamic trainer=ddp_sim  # a grid
    lit-amp hparams_search=optuna                                  # Optuna (lit_amp[optuna])

Run: ``.venv/bin/python examples/hydra_sweep.py [extra overrides, e.g. epochs=2]``
"""

from __future__ import annotations

import sys

from lit_amp.cli import main

if __name__ == "__main__":
    main(["-m", "experiment=sweep_amp", "amp=O0,O1,O2,O3", *sys.argv[1:]])
