"""The config tree of ``lit-amp`` (YAML package data; Hydra's ``pkg://lit_amp.cli.conf``)."""
