"""``Model`` (the MindSpore facade) and ``LitModel`` (the LightningModule adapter)."""

from lit_amp.model.lit_model import LitModel
from lit_amp.model.model import Model

__all__ = ["Model", "LitModel"]
