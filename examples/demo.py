"""`make demo`: a small CNN on MNIST-1D (generated offline) trained through Model.fit.

Prints the loss and epoch times (LossMonitor, TimeMonitor), the test accuracy and where the
logs and checkpoints went (runs/demo/<date>_<time>/). Extra arguments are lit-amp overrides,
e.g. `amp=O2 epochs=10`. Target: >= 85% test accuracy in under 2 minutes on 2 CPU cores.
"""

import sys

from lit_amp.cli import main

if __name__ == "__main__":
    # the default experiment of `lit-amp`, its outputs under runs/demo/<date>_<time>/
    acc = main(["task_name=demo", *sys.argv[1:]])
    sys.exit(0 if acc >= 0.85 else 1)
