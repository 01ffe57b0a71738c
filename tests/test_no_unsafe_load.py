"""No code path of lit_amp unpickles arbitrary objects from a file (issue #18 item 4).

``torch.load(weights_only=False)``, ``pickle.load``/``pickle.loads`` (and ``cloudpickle``,
``dill``, ``joblib.load``, ``shelve``) and ``numpy.load(allow_pickle=True)`` run code stored
in the file. lit_amp reads checkpoints, published weights, cursors and PCA matrices that may
come from elsewhere, so none of these may appear in the package. A truly needed use goes in
:data:`ALLOWED` as ``(relative path, stripped source line)`` with a comment saying why the file
is trusted (created by lit_amp in the same run).
"""

from __future__ import annotations

import re
from pathlib import Path

import lit_amp

ROOT = Path(lit_amp.__file__).resolve().parent

UNSAFE = re.compile(
    r"weights_only\s*=\s*False"
    r"|\bpickle\s*\.\s*loads?\s*\("
    r"|\bcloudpickle\s*\.\s*loads?\s*\("
    r"|\bdill\s*\.\s*loads?\s*\("
    r"|\bjoblib\s*\.\s*load\s*\("
    r"|\bshelve\s*\.\s*open\s*\("
    r"|allow_pickle\s*=\s*True"
    r"|\bUnpickler\s*\("
)

#: (path relative to lit_amp/, stripped line) pairs that are allowed, each with its reason
ALLOWED: set[tuple[str, str]] = {
    # the error message of load_checkpoint tells the user of the explicit opt-in for a file
    # they trust; the package itself never passes weights_only=False
    ("serialization.py",
     'f"({type(exc).__name__}: {exc}); if the file is trusted, pass weights_only=False."'),
}


def _hits() -> list[tuple[str, int, str]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            code = line.split("#", 1)[0]
            if UNSAFE.search(code) and (rel, line.strip()) not in ALLOWED:
                out.append((rel, no, line.strip()))
    return out


def test_pattern_catches_the_unsafe_calls() -> None:
    """The grep itself can fail: each unsafe spelling is matched, safe ones are not."""
    for bad in ("torch.load(p, weights_only=False)", "pickle.load(f)", "pickle.loads(b)",
                "np.load(p, allow_pickle=True)", "x = weights_only = False",
                "dill.load(f)", "pickle.Unpickler(f)"):
        assert UNSAFE.search(bad), bad
    for good in ("torch.load(p, weights_only=True)", "np.load(p, allow_pickle=False)",
                 "pickle.dumps(x)"):
        assert not UNSAFE.search(good), good


def test_no_unsafe_deserialisation_in_the_package() -> None:
    hits = _hits()
    assert not hits, (
        "code that unpickles arbitrary objects from a file (a crafted file runs code): "
        + "; ".join(f"lit_amp/{rel}:{no}: {line}" for rel, no, line in hits)
        + ". Use torch.load(..., weights_only=True) / lit_amp.serialization.load_checkpoint, "
        "or add a "
        "commented entry to ALLOWED in tests/test_no_unsafe_load.py."
    )
