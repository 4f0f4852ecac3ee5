"""The CoMERA schedule as plain objects with their own ``state_dict``: stages, the L₀ policy, the objective."""

from .loss_target import AUTO_LOSS_METRICS, TRAIN_LOSS_TARGET, LossTarget
from .objective import ComeraObjective
from .stages import STAGES, StageSchedule

__all__ = ["AUTO_LOSS_METRICS", "STAGES", "TRAIN_LOSS_TARGET", "ComeraObjective", "LossTarget", "StageSchedule"]
