"""The GPU kit: ``make gpu-wheels`` (here), ``make gpu-check`` (on the GPU machine) and
``make gpu-report`` (back here); README "On a GPU"."""
