"""The CoMERA schedule as plain objects with their own ``state_dict``: stages, the L₀ policy, the objective."""

from comera_lightning.schedule.loss_target import AUTO_LOSS_METRICS, TRAIN_LOSS_TARGET, LossTarget
from comera_lightning.schedule.objective import ComeraObjective
from comera_lightning.schedule.stages import STAGES, StageSchedule

__all__ = ["AUTO_LOSS_METRICS", "STAGES", "TRAIN_LOSS_TARGET", "ComeraObjective", "LossTarget", "StageSchedule"]
