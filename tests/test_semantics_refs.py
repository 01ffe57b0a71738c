"""The project cites only what is in the project: ``docs/semantics.md`` and its sections.

Docstrings, comments and docs once cited "spec §x.y" of a document that is not in the
repository. They now cite ``docs/semantics.md §x.y``. These tests keep it that way:

- no "spec §" is left in ``lit_amp/``, ``docs/`` or ``README.md`` (outside the allow-list);
- every ``semantics.md §x.y`` (or ``§x.y-x.z``) names a section heading of docs/semantics.md;
- every conformance scenario, test file and ``differences.md#anchor`` that docs/semantics.md
  names exists, so the page cannot point at proof that is not there.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEMANTICS = REPO / "docs" / "semantics.md"
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".txt", ".toml", ".cfg", ".rst"}

# Files still citing "spec §" that are owned elsewhere; the lead points them at
# docs/semantics.md and then empties this set.
SPEC_ALLOW: set[str] = set()

SECTION_REF = re.compile(r"semantics\.md\s*§\s*(\d+(?:\.\d+)?)(?:\s*-\s*(\d+(?:\.\d+)?))?")
HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)?)\s+\S", re.MULTILINE)


def _text_files() -> list[Path]:
    files = [REPO / "README.md"]
    for top in ("lit_amp", "docs"):
        files += [
            p for p in sorted((REPO / top).rglob("*"))
            if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts
        ]
    return files


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _sections() -> set[str]:
    return set(HEADING.findall(SEMANTICS.read_text(encoding="utf-8")))


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    text = md.read_text(encoding="utf-8")
    return {_slug(h) for h in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.MULTILINE)}


def test_no_spec_section_reference_is_left():
    found = []
    for path in _text_files():
        if _rel(path) in SPEC_ALLOW:
            continue
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "spec §" in line:
                found.append(f"{_rel(path)}:{no}: {line.strip()}")
    assert not found, (
        "'spec §' cites a document that is not in the repository; cite "
        "'docs/semantics.md §x.y' instead:\n" + "\n".join(found)
    )


def test_allow_list_names_only_files_that_still_need_it():
    stale = [
        name for name in sorted(SPEC_ALLOW)
        if not (REPO / name).exists() or "spec §" not in (REPO / name).read_text("utf-8")
    ]
    assert not stale, f"remove from SPEC_ALLOW (no 'spec §' left): {stale}"


def test_semantics_page_has_numbered_sections():
    sections = _sections()
    expected = {"1.1", "1.4", "1.8", "2.4", "2.6", "2.7", "3.1", "3.2", "3.3", "4.1", "4.4", "5"}
    assert expected <= sections, f"missing sections: {sorted(expected - sections)}"


def test_every_semantics_reference_names_an_existing_section():
    sections = _sections()
    bad, count = [], 0
    for path in _text_files():
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in SECTION_REF.finditer(line):
                count += 1
                for number in filter(None, match.groups()):
                    if number not in sections:
                        bad.append(f"{_rel(path)}:{no}: §{number} ({line.strip()})")
    assert count >= 20, f"only {count} references to docs/semantics.md found"
    assert not bad, "no such section in docs/semantics.md:\n" + "\n".join(bad)


def test_semantics_page_points_only_at_proof_that_exists():
    text = SEMANTICS.read_text(encoding="utf-8")
    missing = []
    scenarios = set(re.findall(r"conformance/scenarios/([a-z_]+)", text))
    assert len(scenarios) >= 8, sorted(scenarios)
    missing += [s for s in sorted(scenarios) if not (REPO / "conformance/scenarios" / s).is_dir()]
    for path, func in re.findall(r"`(tests/[\w/]+(?:\.py)?/?)(?:::(\w+))?`", text):
        if not (REPO / path).exists():
            missing.append(path)
        elif func and f"def {func}(" not in (REPO / path).read_text(encoding="utf-8"):
            missing.append(f"{path}::{func}")
    for page, anchor in re.findall(r"\]\(([\w.]+\.md)#([\w\-]+)\)", text):
        if anchor not in _anchors(REPO / "docs" / page):
            missing.append(f"{page}#{anchor}")
    assert "../shared" not in text and "mindspore_spec" not in text
    assert not missing, f"docs/semantics.md names what does not exist: {missing}"
