"""MindSpore's ``CheckpointConfig`` (``lit_amp.callbacks.checkpoint_config``): precedence between
the save triggers and the keep policies, and every argument check."""

from __future__ import annotations

import pytest

from lit_amp.callbacks.checkpoint_config import CheckpointConfig


def test_checkpoint_config_normalisation() -> None:
    c = CheckpointConfig(save_checkpoint_steps=5, save_checkpoint_seconds=7)
    assert (c.save_checkpoint_steps, c.save_checkpoint_seconds) == (5, None)
    c = CheckpointConfig(keep_checkpoint_max=3, keep_checkpoint_per_n_minutes=2)
    assert (c.keep_checkpoint_max, c.keep_checkpoint_per_n_minutes) == (3, None)
    c = CheckpointConfig(keep_checkpoint_max=0, keep_checkpoint_per_n_minutes=0)
    assert c.keep_checkpoint_max == 1
    assert CheckpointConfig().append_dict is None
    assert CheckpointConfig(incremental=True).map_param_inc is True
    assert CheckpointConfig().get_checkpoint_policy()["save_checkpoint_steps"] == 1


@pytest.mark.parametrize(
    ("kwargs", "exc", "pattern"),
    [
        ({"save_checkpoint_steps": -1}, ValueError, "save_checkpoint_steps.*-1"),
        ({"save_checkpoint_seconds": 1.5}, TypeError, "save_checkpoint_seconds"),
        ({"keep_checkpoint_max": -2}, ValueError, "keep_checkpoint_max"),
        ({"keep_checkpoint_per_n_minutes": "1"}, TypeError, "keep_checkpoint_per_n_minutes"),
        (
            {
                "save_checkpoint_steps": 0,
                "save_checkpoint_seconds": 0,
                "keep_checkpoint_max": 0,
                "keep_checkpoint_per_n_minutes": None,
            },
            ValueError,
            "can't all be None or 0",
        ),
        ({"integrated_save": 1}, TypeError, "integrated_save"),
        ({"async_save": "no"}, TypeError, "async_save"),
        ({"exception_save": None}, TypeError, "exception_save"),
        ({"saved_network": {"w": 1}}, TypeError, "saved_network"),
        ({"append_info": "epoch_num"}, TypeError, "append_info"),
        ({"append_info": ["epoch"]}, ValueError, "append_info.*'epoch'"),
        ({"append_info": [3]}, TypeError, "append_info"),
        ({"append_info": [{"global_step": 3}]}, ValueError, "append_info.*'global_step'"),
        ({"append_info": [{"a": 1}, {"b": 2}]}, TypeError, "at most one dict"),
        ({"append_info": [{1: 1}]}, TypeError, "append_info"),
        ({"append_info": [{"a": [1]}]}, TypeError, "append_info"),
        ({"enc_key": "secret"}, ValueError, "enc_key"),  # mindspore 2.10: ValueError
        ({"enc_key": b"0123456789abcdef"}, ValueError, "enc_key"),
        ({"enc_mode": "ROT13"}, ValueError, "enc_mode.*ROT13"),
        # mindspore 2.10 (issue #48 item 7): ValueError for the type of enc_mode, crc_check
        # and format too ("The parameter 'enc_mode' must be isinstance of <class 'str'>")
        ({"enc_mode": 1}, ValueError, "'enc_mode' must be a str"),
        ({"enc_mode": None}, ValueError, "'enc_mode' must be a str"),
        ({"enc_mode": b"AES-GCM"}, ValueError, "'enc_mode' must be a str"),
        ({"crc_check": 1}, ValueError, "'crc_check' must be a bool"),
        ({"crc_check": None}, ValueError, "'crc_check' must be a bool"),
        ({"crc_check": "True"}, ValueError, "'crc_check' must be a bool"),
        ({"format": 1}, ValueError, "'format' must be a str"),
        ({"format": None}, ValueError, "'format' must be a str"),
        ({"format": "safetensors"}, ValueError, "format"),  # mindspore 2.10 accepts it
        ({"incremental": "yes"}, TypeError, "incremental"),
        ({"bogus": 1}, TypeError, "bogus"),
    ],
)
def test_checkpoint_config_bad_arguments(kwargs: dict, exc: type, pattern: str) -> None:
    with pytest.raises(exc, match=pattern):
        CheckpointConfig(**kwargs)
