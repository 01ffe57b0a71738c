"""Row increments (``lit_amp.rec.state.increments``) read through ``load_checkpoint``: a
hostile increment is a ValueError, never a wrong state; a chain is read back holding the state
once, with no file left mapped."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from lit_amp.serialization import load_checkpoint


def _good_rows() -> dict:
    return {"prev": "a.ckpt", "prev_id": "A", "tensors": [[["state_dict", "w"],
                                                            torch.tensor([1, 3])]]}


@pytest.mark.parametrize("rows,part", [
    ("not a dict", torch.zeros(2, 4)),
    ({**_good_rows(), "prev": None}, torch.zeros(2, 4)),
    ({**_good_rows(), "prev": "../a.ckpt"}, torch.zeros(2, 4)),
    ({**_good_rows(), "prev": "missing.ckpt"}, torch.zeros(2, 4)),
    ({**_good_rows(), "prev_id": "B"}, torch.zeros(2, 4)),
    ({**_good_rows(), "prev_id": None}, torch.zeros(2, 4)),
    ({**_good_rows(), "tensors": "all"}, torch.zeros(2, 4)),
    ({**_good_rows(), "tensors": [["state_dict", "w"]]}, torch.zeros(2, 4)),
    ({**_good_rows(), "tensors": [[[], torch.tensor([1])]]}, torch.zeros(2, 4)),
    ({**_good_rows(), "tensors": [[["state_dict", "nope"], torch.tensor([1, 3])]]},
     torch.zeros(2, 4)),
    ({**_good_rows(), "tensors": [[["state_dict", "w"], [1, 3]]]}, torch.zeros(2, 4)),
    ({**_good_rows(), "tensors": [[["state_dict", "w"], torch.tensor([[1, 3]])]]},
     torch.zeros(2, 4)),
    ({**_good_rows(), "tensors": [[["state_dict", "w"], torch.tensor([1, 99])]]},
     torch.zeros(2, 4)),
    ({**_good_rows(), "tensors": [[["state_dict", "w"], torch.tensor([-1, 3])]]},
     torch.zeros(2, 4)),
    (_good_rows(), torch.zeros(3, 4)),  # rows and values disagree
    (_good_rows(), torch.zeros(2, 5)),  # another row width
    (_good_rows(), torch.zeros(2, 4, dtype=torch.float64)),
])
def test_a_hostile_row_increment_is_a_value_error_never_a_wrong_state(tmp_path, rows, part):
    """Every malformed ``lit_amp_rows`` (or a predecessor that does not fit it) is refused
    with load_checkpoint's ValueError; the predecessor is never changed."""
    base = {"state_dict": {"w": torch.zeros(10, 4)}, "lit_amp_chain_id": "A"}
    torch.save(base, tmp_path / "a.ckpt")
    torch.save({"state_dict": {"w": part}, "lit_amp_rows": rows}, tmp_path / "b.ckpt")
    with pytest.raises(ValueError, match="load_checkpoint"):
        load_checkpoint(str(tmp_path / "b.ckpt"))
    assert torch.equal(torch.load(tmp_path / "a.ckpt")["state_dict"]["w"], torch.zeros(10, 4))


def test_a_well_formed_row_increment_loads_over_its_predecessor(tmp_path):
    torch.save({"state_dict": {"w": torch.zeros(10, 4)}, "lit_amp_chain_id": "A"},
               tmp_path / "a.ckpt")
    torch.save({"state_dict": {"w": torch.ones(2, 4)}, "lit_amp_rows": _good_rows()},
               tmp_path / "b.ckpt")
    w = load_checkpoint(str(tmp_path / "b.ckpt"))["state_dict"]["w"]
    assert w.shape == (10, 4) and w[[1, 3]].eq(1).all() and w.sum() == 8


_CHAIN_LOAD = textwrap.dedent("""
    import json, os, sys
    import torch
    from lit_amp import serialization
    from lit_amp.rec.state import increments
    increments._ROWS_PART_BYTES = 8 << 20
    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) << 10
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak RSS starts again from the RSS now
    before = status("VmRSS")
    state = serialization.load_checkpoint(os.path.join(sys.argv[1], "c.ckpt"))
    peak = status("VmHWM") - before
    w = state["state_dict"]["w"]
    i = torch.arange(len(w))[:, None]
    n = i.float()
    want = torch.where(i % 3 == 0, -n, torch.where(i % 2 == 0, n, 0.0)).expand_as(w)
    print(json.dumps({
        "peak": peak, "right": bool(torch.equal(w, want)),
        "b": state["state_dict"]["b"].tolist(),
        "mapped": [line.split()[-1] for line in open("/proc/self/maps") if sys.argv[1] in line],
    }))
""")


def test_a_chain_is_read_back_holding_the_state_once_and_no_file_mapped(tmp_path):
    """Resuming from a row increment: the full checkpoint is read into memory and the
    increments' rows written into it a part at a time. In a fresh process the peak RSS grows by
    about one copy of the table (not the mapped full file, its copied-on-write pages and the
    increments on top: 2.7 x before), the values are the chain's, and no file of the chain stays
    mapped (a pruned checkpoint's disk space is freed)."""
    rows, dim = 4 << 20, 16  # a 256 MiB table
    table = rows * dim * 4
    ids = torch.arange(rows)
    torch.save({"state_dict": {"w": torch.zeros(rows, dim), "b": torch.zeros(2)},
                "lit_amp_chain_id": "A"}, tmp_path / "a.ckpt")
    even, third = ids[ids % 2 == 0], ids[ids % 3 == 0]
    torch.save({"state_dict": {"w": even[:, None].float().expand(-1, dim).clone(),
                               "b": torch.ones(2)},
                "lit_amp_chain_id": "B",
                "lit_amp_rows": {"prev": "a.ckpt", "prev_id": "A",
                                 "tensors": [[["state_dict", "w"], even]]}}, tmp_path / "b.ckpt")
    torch.save({"state_dict": {"w": -third[:, None].float().expand(-1, dim).clone(),
                               "b": torch.full((2,), 2.0)},
                "lit_amp_chain_id": "C",
                "lit_amp_rows": {"prev": "b.ckpt", "prev_id": "B",
                                 "tensors": [[["state_dict", "w"], third]]}}, tmp_path / "c.ckpt")
    out = subprocess.run([sys.executable, "-c", _CHAIN_LOAD, str(tmp_path)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["right"] and got["b"] == [2.0, 2.0]
    assert got["mapped"] == []
    assert got["peak"] < 1.25 * table, f"peak RSS grew {got['peak'] / table:.2f} x the table"


def test_a_chain_read_back_keeps_the_state_dicts_type_and_metadata(tmp_path):
    """``load_state_dict`` reads a module's version from the state dict's ``_metadata``: a
    chain read back keeps it, as a whole checkpoint read does."""
    from collections import OrderedDict

    net = nn.BatchNorm1d(3)
    sd = net.state_dict()
    torch.save({"state_dict": sd, "lit_amp_chain_id": "A"}, tmp_path / "a.ckpt")
    inc = OrderedDict(sd)
    inc._metadata = sd._metadata
    inc["running_mean"] = torch.ones(1)
    torch.save({"state_dict": inc, "lit_amp_rows": {
        "prev": "a.ckpt", "prev_id": "A",
        "tensors": [[["state_dict", "running_mean"], torch.tensor([1])]]}}, tmp_path / "b.ckpt")
    got = load_checkpoint(str(tmp_path / "b.ckpt"))["state_dict"]
    assert type(got) is OrderedDict and got._metadata == sd._metadata
    assert got["running_mean"].tolist() == [0.0, 1.0, 0.0]


# ---------------------------------- MindSpore's load_checkpoint / load_param_into_net
