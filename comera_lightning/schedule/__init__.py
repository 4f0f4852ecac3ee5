"""The CoMERA schedule as plain objects with their own ``state_dict``: stages, the L₀ policy, the objective and its guard."""

from comera_lightning.schedule.loss_target import AUTO_LOSS_METRICS, TRAIN_LOSS_TARGET, LossTarget
from comera_lightning.schedule.guard import QualityGuard
from comera_lightning.schedule.objective import LATE_OBJECTIVES, ComeraObjective
from comera_lightning.schedule.stages import STAGES, StageSchedule
from comera_lightning.schedule.config import BudgetConfig

__all__ = ["AUTO_LOSS_METRICS", "BudgetConfig", "LATE_OBJECTIVES", "STAGES", "QualityGuard", "TRAIN_LOSS_TARGET", "ComeraObjective", "LossTarget", "StageSchedule"]
