"""Re-export of :mod:`lit_amp.amp.convert` and :mod:`lit_amp.amp.levels` (the import path of
earlier releases)."""

from lit_amp.amp.casting import invalidate_cast_cache
from lit_amp.amp.convert import (
    auto_mixed_precision,
    custom_mixed_precision,
    get_amp_level,
    remove_mixed_precision,
)
from lit_amp.amp.levels import AMP_LEVELS, LOW_DTYPES, validate_amp_dtype, validate_amp_level

__all__ = [
    "auto_mixed_precision",
    "custom_mixed_precision",
    "remove_mixed_precision",
    "invalidate_cast_cache",
    "get_amp_level",
    "validate_amp_level",
    "validate_amp_dtype",
    "AMP_LEVELS",
    "LOW_DTYPES",
]
