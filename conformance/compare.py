"""Compare lit_amp against the recorded MindSpore goldens (no MindSpore needed).

Usage (from the repository root, in lit_amp's venv)::

    python -m conformance.compare [scenario ...]     # prints every disagreement, exit 1 if any
    python -m conformance.compare --report           # markdown table of agree/deviate/defect

Each scenario's ``lit.py`` runs in this process (``run()`` returns the observables). Every
golden key is compared with a per-key tolerance (:data:`TOLERANCES`); keys listed in
``deviations.json`` are expected to differ:

- ``"kind": "deliberate"``: lit_amp differs on purpose; ``"doc"`` is text that must appear in
  ``docs/differences.md`` (the entry explaining it). Not compared.
- ``"kind": "defect"``: a known lit_amp bug (``"issue"`` names the item). It must still differ;
  once it agrees the check fails, telling whoever fixed it to delete the entry.

A golden value ``{"__ms_unsupported__": why}`` marks a path MindSpore cannot run on CPU (not
compared); ``{"__derived__": value, "why": ...}`` is a value derived from MindSpore's source
rule instead of a run (compared like a recorded one).
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLD = ROOT / "conformance" / "goldens"
DEVIATIONS = ROOT / "conformance" / "deviations.json"
DIFFERENCES = ROOT / "docs" / "differences.md"

DEFAULT_TOL = {"rtol": 1e-5, "atol": 1e-6}
# "scenario/key" glob -> tolerance; the first match wins
TOLERANCES: dict[str, dict[str, float]] = {
    # fp16 arithmetic: MindSpore's CPU fp16 MatMul rounds differently from torch's (seen: 5 ulps)
    "amp_*/*loss*": {"rtol": 5e-3, "atol": 3e-3},
    # an inf in the input: MindSpore's softmax cross-entropy returns inf, torch's nan
    "loss_scale/*loss": {"rtol": 1e-5, "atol": 1e-6, "nonfinite_equal": True},
    "thor/*": {"rtol": 1e-6, "atol": 1e-7},
}


def tolerance(key: str) -> dict[str, float]:
    for pat, tol in TOLERANCES.items():
        if fnmatch.fnmatchcase(key, pat):
            return tol
    return DEFAULT_TOL


def equal(a, b, tol) -> tuple[bool, str]:
    """(agrees, why not) for golden value a and lit_amp value b."""
    if isinstance(a, dict) and "__derived__" in a:
        a = a["__derived__"]
    if tol.get("nonfinite_equal") and a in ("nan", "inf", "-inf") and b in ("nan", "inf", "-inf"):
        return True, ""
    if isinstance(a, bool) or isinstance(b, bool):
        return (a is b or a == b) and type(a) is type(b), f"{a!r} != {b!r}"
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isclose(a, b, rel_tol=tol["rtol"], abs_tol=tol["atol"]):
            return True, ""
        return False, f"{a!r} != {b!r} (rtol={tol['rtol']}, atol={tol['atol']})"
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return False, f"length {len(a)} != {len(b)}: {_short(a)} vs {_short(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            ok, why = equal(x, y, tol)
            if not ok:
                return False, f"[{i}]: {why}"
        return True, ""
    if isinstance(a, dict) and isinstance(b, dict):
        if sorted(a) != sorted(b):
            return False, f"keys {sorted(a)} != {sorted(b)}"
        for k in a:
            ok, why = equal(a[k], b[k], tol)
            if not ok:
                return False, f"[{k!r}]: {why}"
        return True, ""
    return a == b, f"{_short(a)} != {_short(b)}"


def _short(v, n=160):
    s = json.dumps(v) if not isinstance(v, str) else repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


@dataclass
class Result:
    scenario: str
    agree: list[str] = field(default_factory=list)
    deliberate: list[str] = field(default_factory=list)
    defect: list[str] = field(default_factory=list)  # listed defects that still differ
    unsupported: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # anything that fails the suite
    diffs: dict[str, str] = field(default_factory=dict)


def load_deviations() -> dict[str, dict]:
    return json.loads(DEVIATIONS.read_text())


def scenarios() -> list[str]:
    return sorted(p.stem for p in GOLD.glob("*.json"))


def run_lit(name: str) -> dict:
    import numpy as np
    import torch

    from conformance import _common

    torch.manual_seed(0)
    np.random.seed(0)
    mod = importlib.import_module(f"conformance.scenarios.{name}.lit")
    return json.loads(json.dumps(_common.to_py(mod.run()), sort_keys=True))


def compare(name: str, lit: dict | None = None, deviations: dict | None = None) -> Result:
    golden = json.loads((GOLD / f"{name}.json").read_text())["observables"]
    lit = run_lit(name) if lit is None else lit
    deviations = load_deviations() if deviations is None else deviations
    doc_text = DIFFERENCES.read_text() if DIFFERENCES.exists() else ""
    res = Result(name)
    for key in sorted(golden):
        full = f"{name}/{key}"
        want = golden[key]
        dev = deviations.get(full)
        if isinstance(want, dict) and "__ms_unsupported__" in want:
            res.unsupported.append(key)
            continue
        if key not in lit:
            res.problems.append(f"{full}: missing on the lit_amp side")
            continue
        ok, why = equal(want, lit[key], tolerance(full))
        if not ok:
            res.diffs[key] = why
        if dev is None:
            (res.agree if ok else res.problems).append(key if ok else f"{full}: {why}")
        elif dev["kind"] == "deliberate":
            if dev.get("doc") and dev["doc"] not in doc_text:
                res.problems.append(
                    f"{full}: deliberate deviation points at {dev['doc']!r}, which is not in "
                    "docs/differences.md"
                )
            res.deliberate.append(key)
        elif dev["kind"] == "defect":
            if ok:
                res.problems.append(
                    f"{full}: listed as defect (issue item {dev.get('issue')}) but now agrees "
                    "with MindSpore: remove its entry from conformance/deviations.json"
                )
            else:
                res.defect.append(key)
        else:
            res.problems.append(f"{full}: unknown deviation kind {dev['kind']!r}")
    for full in deviations:
        scen, _, key = full.partition("/")
        if scen == name and key not in golden:
            res.problems.append(f"{full}: deviation entry for a key the golden does not have")
    return res


def report(results: list[Result]) -> str:
    gold = {r.scenario: json.loads((GOLD / f"{r.scenario}.json").read_text()) for r in results}
    lines = [
        "| scenario | observables | agree | deliberate | defect | MS can't run on CPU | problems |",
        "|---|---|---|---|---|---|---|",
    ]
    tot = [0] * 6
    for r in results:
        row = [
            len(gold[r.scenario]["observables"]),
            len(r.agree),
            len(r.deliberate),
            len(r.defect),
            len(r.unsupported),
            len(r.problems),
        ]
        tot = [a + b for a, b in zip(tot, row)]
        lines.append(f"| {r.scenario} | " + " | ".join(map(str, row)) + " |")
    lines.append("| **total** | " + " | ".join(f"**{n}**" for n in tot) + " |")
    dev = load_deviations()
    lines += ["", "Expected differences (`conformance/deviations.json`, grouped by reason):", ""]
    groups: dict[tuple, list[str]] = {}
    for r in results:
        for key in r.deliberate + r.defect:
            d = dev[f"{r.scenario}/{key}"]
            tag = (
                f"defect (issue item {d.get('issue')})"
                if d["kind"] == "defect"
                else f'deliberate (differences.md: "{d.get("doc")}")'
            )
            groups.setdefault((r.scenario, tag, d.get("reason", "")), []).append(key)
    for (scen, tag, reason), keys in groups.items():
        shown = ", ".join(f"`{k}`" for k in keys)
        lines.append(f"- **{scen}** {shown} — {tag}: {reason}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    want_report = "--report" in argv
    names = [a for a in argv if not a.startswith("-")] or scenarios()
    results = [compare(n) for n in names]
    if want_report:
        print(report(results))
    else:
        for r in results:
            print(
                f"{r.scenario}: {len(r.agree)} agree, {len(r.deliberate)} deliberate, "
                f"{len(r.defect)} defect, {len(r.unsupported)} unsupported on MS CPU, "
                f"{len(r.problems)} problems"
            )
            for p in r.problems:
                print("  PROBLEM", p)
            if "-v" in argv:
                for k, why in r.diffs.items():
                    print(f"  diff {k}: {why}")
    return 1 if any(r.problems for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
