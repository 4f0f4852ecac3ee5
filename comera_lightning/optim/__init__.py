"""Optimizers for tensorized training: CAME, the rank gates' own Adam, the paper's param groups, slicing optimizer state."""

from comera_lightning.optim.came import CAME
from comera_lightning.optim.core_steps import DEFAULT_CORE_STEP_SCALE, CoreStepScale
from comera_lightning.optim.gates import DEFAULT_GATE_LR, GateOptimizer
from comera_lightning.optim.param_groups import comera_param_groups, param_group_of
from comera_lightning.optim.state import slice_optimizer_state_

__all__ = ["CAME", "DEFAULT_CORE_STEP_SCALE", "DEFAULT_GATE_LR", "CoreStepScale", "GateOptimizer", "comera_param_groups", "param_group_of", "slice_optimizer_state_"]
