"""A griffe extension for the API reference: read ``Example:`` as Google's examples section.

lit_amp's docstrings title their doctests ``Example:`` (Napoleon's spelling); griffe's Google
parser only knows ``Examples:`` and would render the doctests as an admonition of plain text.
Loaded by ``mkdocs.yml`` (``mkdocstrings`` -> ``extensions``); not part of the package.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(Extension):
    """Rename every ``Example:`` section title to ``Examples:`` when griffe loads an object."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring in place (``kwargs``: griffe's other hook arguments)."""
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
