"""Differential conformance suite: lit_amp against real MindSpore 2.10 (see docs/conformance.md)."""
