"""``bench/_common.py``, the benchmarks' one harness: paired ratios and their interval, targets,
result files that keep their history, the doc splicer and the options declared as data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import _common as harness  # noqa: E402


def test_measure_pairs_each_round_and_rotates_the_order():
    calls: list[str] = []
    m = harness.measure({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                        rounds=4, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert m.baseline == "a" and all(len(v) == 4 for v in m.rounds.values())
    m = harness.Measurement({"a": [1.0, 2.0, 4.0, 1.0], "b": [1.1, 2.2, 4.4, 1.1]}, "a")
    assert m.ratios("b") == pytest.approx([1.1] * 4)  # a drift hits both sides of a round
    assert m.interval("b") == pytest.approx([1.1, 1.1])
    assert m.summary()["median_ratio"]["b"] == pytest.approx(1.1)


def test_bootstrap_needs_three_cycles():
    assert harness.bootstrap(2, lambda pick: 1.0) == []
    lo, hi = harness.bootstrap(10, lambda pick: float(pick.mean()))
    assert 0 <= lo <= hi <= 9


def test_targets_are_data_and_a_missing_value_is_missed(capsys):
    targets = [harness.Target("speed", ">=", 2.0), harness.Target("cost", "<=", 1.05),
               harness.Target("gone", ">=", 1.0)]
    records = harness.check_targets(targets, {"speed": 2.5, "cost": 1.2})
    assert [r["met"] for r in records] == [True, False, False]
    out = capsys.readouterr().out
    assert "speed >= 2: 2.500 met" in out and "cost <= 1.05: 1.200 MISSED" in out
    assert harness.targets_table(records)[2] == "| speed | 2.500 | >= 2 | yes |"


def test_a_result_file_keeps_every_run(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RESULTS", tmp_path)
    info = {"cpu": "test"}
    harness.write_result("x", {"v": 1}, machine_info=info)
    harness.write_result("x", {"v": 9}, machine_info=info, variant="smoke")
    harness.write_result("x", {"v": 2}, machine_info=info)
    data = json.loads((tmp_path / "x.json").read_text())
    assert data["v"] == 2 and [h["v"] for h in data["history"]] == [1, 9]
    assert harness.load_result("x")["v"] == 2 and "history" not in harness.load_result("x")
    assert harness.load_result("x", variant="smoke")["v"] == 9
    assert [h["v"] for h in harness.load_history("x")] == [1, 9, 2]
    assert harness.load_result("absent") == {} and harness.load_history("absent") == []


def test_splice_replaces_its_section_only(tmp_path):
    doc = tmp_path / "b.md"
    doc.write_text("# B\n\n<!-- bench:a:start -->\nold\n<!-- bench:a:end -->\n\nkept\n")
    harness.splice("a", "new", doc=doc)
    harness.splice("c", "third", after="a", doc=doc)
    harness.splice("d", "last", doc=doc)
    text = doc.read_text()
    assert "old" not in text and text.count("<!-- bench:a:start -->") == 1
    assert text.index("new") < text.index("third") < text.index("kept") < text.index("last")


def test_options_are_declared_as_data():
    ap = harness.parser("doc", steps=100, work_ms=8.0, sizes=[1, 2])
    a = ap.parse_args(["--work-ms", "2.5", "--sizes", "3", "4", "5", "--no-doc"])
    assert (a.steps, a.work_ms, a.sizes, a.no_doc) == (100, 2.5, [3, 4, 5], True)
    assert not hasattr(harness.parser(None, doc_option=False).parse_args([]), "no_doc")
