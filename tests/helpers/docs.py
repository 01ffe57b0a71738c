"""Fenced code blocks of a Markdown text, for the tests that run the documentation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fenced:
    """One fenced block: its language, first body line (1-based), body lines, the last
    non-blank line before the fence (a marker comment such as ``<!-- skip-test: ... -->``)
    and the Markdown heading it sits under."""

    lang: str
    line: int
    body: tuple[str, ...]
    marker: str
    heading: str


def fenced_blocks(text: str) -> list[Fenced]:
    """Every fenced block of ``text`` (```lang ... ```), in order.

    Example:
        >>> text = "# A\\n<!-- m -->\\n```py\\nx\\n```"
        >>> [(b.lang, b.body, b.marker, b.heading) for b in fenced_blocks(text)]
        [('py', ('x',), '<!-- m -->', '# A')]
    """
    lines = text.splitlines()
    blocks, heading, i = [], "", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.strip()
        elif line.startswith("```"):
            lang, start, body = line.strip()[3:].strip(), i + 1, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            marker = next((lines[j].strip() for j in range(start - 2, -1, -1)
                           if lines[j].strip()), "")
            blocks.append(Fenced(lang, start + 1, tuple(body), marker, heading))
        i += 1
    return blocks
