"""A Hydra sweep of the AMP levels: ``lit-amp -m experiment=sweep_amp amp=O0,O1,O2,O3``.

Each job trains MNIST-1D's CNN (with BatchNorm) for 5 epochs at one AMP level and writes its
``result.json``; when the sweep ends, ``summary.md`` (accuracy, throughput, wall time per level)
and ``summary.png`` appear in the sweep directory, and the table is printed. The same from the
shell::

    lit-amp -m experiment=sweep_amp amp=O0,O1,O2,O3
    lit-amp -m experiment=sweep_amp amp=O2,O3 loss_scale=none,dynamic trainer=ddp_sim  # a grid
    lit-amp hparams_search=optuna                                  # Optuna (lit_amp[optuna])

Run: ``.venv/bin/python examples/hydra_sweep.py [extra overrides, e.g. epochs=2]``
"""

from __future__ import annotations

import sys

from lit_amp.cli import main

if __name__ == "__main__":
    main(["-m", "experiment=sweep_amp", "amp=O0,O1,O2,O3", *sys.argv[1:]])
