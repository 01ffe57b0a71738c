"""The names of MindSpore's AMP and boost levels, in one torch-free home.

The argument checks, the level tables (:mod:`lit_amp.amp.levels`, :mod:`lit_amp.boost.config`)
and the ``lit-amp`` schema's enums (:mod:`lit_amp.cli.schema`, which imports no torch) are built
from these tuples, so a level is added here and in its table.

Example:
    >>> AMP_LEVELS[-1], BOOST_LEVELS
    ('auto', ('O0', 'O1', 'O2'))
"""

__all__ = ["AMP_LEVELS", "BOOST_LEVELS"]

#: Levels accepted by ``amp_level`` / ``level`` arguments.
AMP_LEVELS: tuple[str, ...] = ("O0", "O1", "O2", "O3", "auto")
#: Levels accepted by ``boost_level`` arguments (the algorithms per level: lit_amp.boost.config).
BOOST_LEVELS: tuple[str, ...] = ("O0", "O1", "O2")
