"""Optimizers for tensorized training: CAME, and slicing optimizer state when parameters shrink."""

from comera_lightning.optim.came import CAME
from comera_lightning.optim.state import slice_optimizer_state_

__all__ = ["CAME", "slice_optimizer_state_"]
