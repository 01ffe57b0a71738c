"""Hostile ``ckpt_path`` files (issue #48, item 18): each is one message naming the file and
what is wrong, from the torch-free check (:mod:`lit_amp.cli.precheck`) and from
:func:`lit_amp.cli.checkpoint.read_checkpoint` alike, never a traceback of another error."""

from __future__ import annotations

import io
import zipfile

import pytest
import torch

from lit_amp.cli.checkpoint import read_checkpoint
from lit_amp.cli.precheck import check_checkpoint_file, check_config
from lit_amp.cli.schema import ConfigError


def _good(path):
    torch.save({"state_dict": {"w": torch.ones(3)}}, path)
    return path


def _truncated(path):
    buf = io.BytesIO()
    torch.save({"state_dict": {"w": torch.ones(1000)}}, buf)
    path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    return path


def _other_zip(path):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hello")
    return path


def _directory(path):
    path.mkdir()
    return path


def _bytes(data):
    def make(path):
        path.write_bytes(data)
        return path
    return make


HOSTILE = {
    "empty": (_bytes(b""), "is empty (0 bytes), not a checkpoint"),
    "truncated": (_truncated, "is truncated or damaged"),
    "random bytes": (_bytes(bytes(range(7, 250)) * 3), "is not a checkpoint: it is neither"),
    "text": (_bytes(b"epoch: 3\nacc: 0.9\n"), "is not a checkpoint: it is neither"),
    "a zip of something else": (_other_zip, "is a zip archive but not a torch checkpoint"),
    "a directory": (_directory, "is a directory, not a checkpoint file"),
    "missing": (lambda p: p, "does not exist"),
    "a pickle cut short": (_bytes(b"\x80\x02"), "could not be read as a checkpoint of tensors"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_checkpoint_is_one_message_naming_the_file(tmp_path, name):
    make, message = HOSTILE[name]
    path = str(make(tmp_path / "bad.ckpt"))
    with pytest.raises(ConfigError) as info:
        read_checkpoint(path)
    text = str(info.value)
    assert f"ckpt_path={path!r}" in text and message in text, text
    assert "\n" not in text
    if name != "a pickle cut short":  # that one passes the header check; torch.load refuses it
        with pytest.raises(ConfigError, match=message.split(":")[0].replace("(", r"\(")
                           .replace(")", r"\)")):
            check_checkpoint_file(path)
        with pytest.raises(ConfigError, match="ckpt_path"):
            check_config({"mode": "eval", "ckpt_path": path})


def test_a_checkpoint_passes_the_header_check(tmp_path):
    path = str(_good(tmp_path / "good.ckpt"))
    check_checkpoint_file(path)
    check_config({"mode": "train", "ckpt_path": path, "epochs": 1, "data": {"batch_size": 1}})
    assert "state_dict" in read_checkpoint(path)


@pytest.mark.parametrize("data, message", [
    ({"batch_size": -1}, "'data.batch_size' must be an int >= 1, but got -1."),
    ({"batch_size": "8"}, "'data.batch_size' must be an int >= 1, but got '8'."),
    ({"batch_size": 4, "num_workers": -2}, "'data.num_workers' must be an int >= 0"),
    ({"num_train": 0}, "'data.num_train' must be an int >= 1, but got 0."),
])
def test_data_sizes_are_checked_without_torch(data, message):
    with pytest.raises(ConfigError) as info:
        check_config({"data": data})
    assert message in str(info.value)
