"""``lit-amp debug=fdr`` (README's command line): a one-batch check that leaves no checkpoint.

Its checkpoint (one step's weights) would become the run's ``latest_ckpt``, the file a user is
told to resume from; Lightning's ``fast_dev_run`` drops Lightning's own checkpoints and loggers,
not lit_amp's ``ModelCheckpoint`` or the logger node, so ``debug/fdr.yaml`` drops them.
"""

from __future__ import annotations

import json

from lit_amp.cli import main

DATA = ["data=synthetic", "data.num_train=200", "data.num_valid=100"]


def test_fast_dev_run_writes_no_checkpoint_and_no_logs(tmp_path, capsys):
    main(["debug=fdr", *DATA, f"hydra.run.dir={tmp_path}"])
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "ok" and "acc" in result["metrics"]
    assert result.get("latest_ckpt") is None
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "logs").exists()
    assert "checkpoints:" not in capsys.readouterr().out


def test_a_logger_chosen_with_fdr_is_still_used(tmp_path):
    # the command line's logger=... wins over debug=fdr's logger=none
    main(["debug=fdr", "logger=csv", *DATA, f"hydra.run.dir={tmp_path}"])
    assert (tmp_path / "logs").is_dir()
