"""The folder of cursor checkpoints (``lit_amp.rec.online.checkpoint_files``): pruning keeps
every file a kept row increment needs; reading skips what cannot be read."""

from __future__ import annotations

import os

import pytest

from lit_amp.rec.online.checkpoint_files import (
    latest_checkpoint,
    list_checkpoints,
    plain_state,
    prune_checkpoints,
)


@pytest.mark.parametrize("names,keep,kept", [
    (["1", "2r", "3r", "4", "5r"], 2, ["4", "5r"]),
    (["1", "2r", "3r", "4", "5r"], 3, ["1", "2r", "3r", "4", "5r"]),
    (["1", "2r", "3r"], 1, ["1", "2r", "3r"]),
    (["1", "2r", "3", "4r"], 1, ["3", "4r"]),
    (["9", "10r", "11"], 1, ["11"]),
])
def test_pruning_keeps_the_chains_of_the_newest_checkpoints(tmp_path, names, keep, kept):
    def name(n):
        return f"online-{int(n.rstrip('r')):012d}{'-rows' if n.endswith('r') else ''}.ckpt"

    for n in names:
        (tmp_path / name(n)).write_bytes(b"x")
    prune_checkpoints(tmp_path, keep)
    assert [os.path.basename(p) for p in list_checkpoints(tmp_path)] == [name(n) for n in kept]


def test_latest_checkpoint_refuses_a_folder_of_unreadable_files(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    (tmp_path / "online-000000000004.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="none of the 1 checkpoint"):
        latest_checkpoint(tmp_path)


def test_plain_state_is_loadable_with_weights_only():
    assert plain_state({"a": {3, 1}, "b": (1, [2, frozenset("x")])}) == {
        "a": [1, 3], "b": [1, [2, ["x"]]]}
