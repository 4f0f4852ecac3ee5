"""A teacher while a trained model is compressed: the model as it was, distilled into its tensorized self.

``ComeraCallback(distill=DistillConfig(module="model"))`` copies ``module`` (a submodule name; "" for the
LightningModule itself) before tensorizing it, freezes the copy, and hooks the original: in every training forward
of ``module`` the teacher sees the same inputs, and the step's objective becomes

    (1 − α)·L + α·T²·KL(softmax(t/T) ‖ softmax(s/T))

(plus the stage's size terms), the KL over the last axis of both outputs (their logits: a tensor, the ``logits`` of a
model output, or the first element of a tuple), averaged over the rest; a binary model's single logit (a DLRM's
click, shape ``(B,)`` or ``(B, 1)``) is read as Bernoulli logits. The teacher is not a submodule: checkpoints,
optimizers and DDP do not see it. It costs one dense forward a step and the dense weights' memory.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torch.nn import functional as F

from comera_lightning._checks import check_number

__all__ = ["DistillConfig", "Teacher"]


@dataclass(frozen=True)
class DistillConfig:
    """Distillation from the model as it was before tensorizing (for compressing a trained model).

    Args:
        module: the submodule the training step calls whose output is the logits ("model" for a LightningModule
            wrapping a Hugging Face model as ``self.model``); "": the LightningModule's own forward (``self(batch)``).
            One the step never calls is refused at the first step.
        weight: α, the distillation term's share of the task loss's place in the objective.
        temperature: T, the softmax temperature of both sides (the term is scaled by T²).
    """

    module: str = "model"
    weight: float = 0.5
    temperature: float = 1.0

    def __post_init__(self) -> None:
        check_number("distill.weight", self.weight, 0.0, 1.0)
        check_number("distill.temperature", self.temperature, 0.0, low_open=True)


def logits_of(output: Any) -> torch.Tensor:
    """The logits in a module's output: the tensor itself, its ``logits``, or the first element of a tuple."""
    if isinstance(output, torch.Tensor):
        return output
    if getattr(output, "logits", None) is not None:
        return output.logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"distill: cannot find logits in a {type(output).__name__} output; name the submodule that returns "
                    "them as DistillConfig(module=...).")


def as_class_logits(logits: torch.Tensor) -> torch.Tensor:
    """Class logits on the last axis; a binary model's single logit (shape ``(B,)`` or ``(..., 1)``) as the two classes'
    ``[0, z]``, whose softmax is ``[1 − σ(z), σ(z)]`` (otherwise the batch would be taken for the classes)."""
    if logits.dim() == 1 or logits.shape[-1] == 1:
        single = logits.reshape(-1)
        return torch.stack([torch.zeros_like(single), single], dim=-1)
    return logits


def soft_target_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """T²·KL(softmax(teacher/T) ‖ softmax(student/T)) over the last axis, averaged over the others (a single logit:
    the Bernoulli KL of ``σ(teacher/T)`` and ``σ(student/T)``)."""
    student, teacher = as_class_logits(student), as_class_logits(teacher)
    classes = student.shape[-1]
    log_student = F.log_softmax(student.reshape(-1, classes).float() / temperature, dim=-1)
    log_teacher = F.log_softmax(teacher.reshape(-1, classes).float() / temperature, dim=-1)
    return F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean") * temperature ** 2


class Teacher:
    """A frozen copy of a module, run beside it in training; ``mix`` puts its term into the step's objective.

    Built from ``None`` it does nothing (no copy, no hook, the objective unchanged): the callback holds one either way.
    """

    def __init__(self, config: DistillConfig | Mapping[str, Any] | None) -> None:
        self.config = DistillConfig(**config) if isinstance(config, Mapping) else config
        self.model: nn.Module | None = None
        self._handle: Any = None
        self._term: torch.Tensor | None = None

    def refuse_resume(self) -> None:
        """A resumed run has no dense model left to copy: refuse it with a teacher, naming the ways out."""
        if self.config is not None:
            raise ValueError("ComeraCallback(distill=...): the teacher is the model as it was before tensorizing, which a "
                             "resumed run no longer has; resume without distill, or restart the compression from the dense "
                             "weights (--weights_from).")

    def attach(self, pl_module: nn.Module) -> None:
        """Copy ``config.module`` as it is now (before tensorizing; the first time only) and hook its training forwards."""
        if self.config is None:
            return
        try:
            student = pl_module.get_submodule(self.config.module)
        except AttributeError:
            names = [name for name, _ in pl_module.named_children()]
            raise ValueError(f"distill: the module has no submodule {self.config.module!r}; its children are {names} "
                             "(\"\" is the LightningModule itself).") from None
        if self.model is None:  # once: a later setup (test, another fit) finds the module tensorized already
            trainer = pl_module.__dict__.pop("_trainer", None)  # the copy must not drag the Trainer along
            try:
                self.model = copy.deepcopy(student).eval().requires_grad_(False)
            finally:
                if trainer is not None:
                    pl_module._trainer = trainer
            rank_zero_info(f"ComeraCallback: teacher: a frozen copy of {self._described()} as trained, weight "
                           f"{self.config.weight:g} at temperature {self.config.temperature:g} (one dense forward a step).")
        self.detach_hook()
        self._handle = student.register_forward_hook(self._after_forward, with_kwargs=True)

    def _after_forward(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if not module.training or not torch.is_grad_enabled() or self.model is None:
            return
        student = logits_of(output)
        if next(self.model.parameters(), student).device != student.device:
            self.model.to(student.device)
        with torch.no_grad():
            teacher = logits_of(self.model(*args, **kwargs))
        self._term = soft_target_loss(student, teacher, self.config.temperature)

    def mix(self, loss: torch.Tensor, task_loss: torch.Tensor) -> torch.Tensor:
        """``loss`` with α of its task loss replaced by the teacher's term of this step (unchanged without one)."""
        term, self._term = self._term, None
        if term is None:
            if self.config is not None:  # configured, hooked, yet its module's forward did not run in this step
                raise ValueError(f"distill: {self._described()} was not called in this training step, so the teacher had "
                                 "nothing to compare (a training_step that calls the layers itself, not forward, skips "
                                 "it): name the submodule your training_step calls whose output is the logits, as "
                                 "DistillConfig(module=...).")
            return loss
        return loss + self.config.weight * (term.to(loss.dtype) - task_loss)

    def _described(self) -> str:
        return f"the submodule {self.config.module!r}" if self.config.module else "the LightningModule's forward"

    def detach_hook(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
