"""A quiet CPU ``lightning.Trainer`` for tests (no logger, checkpoints, bars or summary)."""

from __future__ import annotations

from typing import Any

import lightning as L

__all__ = ["quiet_trainer"]


def quiet_trainer(tmp_path: Any, **kw: Any) -> L.Trainer:
    """A CPU Trainer writing under ``tmp_path``; ``kw`` goes to the Trainer (8 epochs unless
    ``max_epochs`` is given)."""
    kw.setdefault("max_epochs", 8)
    return L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=str(tmp_path), **kw)
