"""Differential conformance against recorded MindSpore 2.10 goldens (conformance/, no MindSpore).

One case per scenario: every golden observable must agree within its tolerance, except those
listed in conformance/deviations.json. A 'defect' entry must still differ (strict-xfail style:
when it agrees, the case fails and asks for the entry to be removed); a 'deliberate' entry must
point at text present in docs/differences.md.
"""

from __future__ import annotations

import json

import pytest

from conformance import compare

SCENARIOS = compare.scenarios()


def test_goldens_exist():
    assert SCENARIOS, "no goldens in conformance/goldens: run `make conformance-record`"
    for name in SCENARIOS:
        golden = json.loads((compare.GOLD / f"{name}.json").read_text())
        assert golden["mindspore"], name


def test_deviation_entries_are_well_formed():
    for key, dev in compare.load_deviations().items():
        assert "/" in key, key
        assert key.split("/")[0] in SCENARIOS, f"{key}: no such scenario"
        assert dev["kind"] in ("deliberate", "defect"), key
        assert dev.get("reason"), key
        if dev["kind"] == "deliberate":
            assert dev.get("doc") and dev["doc"] in compare.DIFFERENCES.read_text(), key
        else:
            # an item number of the issue, or "new" for a defect this suite found
            assert isinstance(dev.get("issue"), int) or dev.get("issue") == "new", key


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario):
    res = compare.compare(scenario)
    assert not res.problems, "\n".join(res.problems)
