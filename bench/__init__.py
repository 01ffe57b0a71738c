"""Benchmarks: run from the repository root, ``python bench/<name>.py`` or
``python -m bench.<package>.<name>`` (see docs/benchmarks.md)."""
