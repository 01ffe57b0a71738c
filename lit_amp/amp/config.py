"""Re-export of :mod:`lit_amp.amp.levels` and ``apply_amp_config`` (the import path of earlier
releases)."""

from lit_amp.amp.convert import apply_amp_config
from lit_amp.amp.levels import (
    LEVEL_TABLE,
    UNSET,
    AmpConfig,
    cpu_has_native_bf16,
    default_amp_dtype,
    resolve_amp_config,
    validate_amp_level,
)

__all__ = [
    "AmpConfig",
    "UNSET",
    "resolve_amp_config",
    "apply_amp_config",
    "validate_amp_level",
    "default_amp_dtype",
    "cpu_has_native_bf16",
    "LEVEL_TABLE",
]
