"""Loading checkpoints of tensorized models into freshly built (dense) LightningModules.

A checkpoint written with ``ComeraCallback`` holds TT cores (at their pruned ranks) and, under
``checkpoint["comera"]``, the ``tensorize`` arguments. ``Model.load_from_checkpoint`` builds a
dense model first, so something must tensorize it before the state is loaded: the
``on_load_checkpoint`` hook that ``install_checkpoint_loading`` adds. The callback installs it
on the module's class during training; in a new process, decorate the class with
``@tensorized_checkpoints`` (or call ``install_checkpoint_loading(Model)``) before loading.
TT layers then resize themselves to the stored ranks, so the load is strict.
"""

from __future__ import annotations

from typing import Any, TypeVar

from torch import nn

__all__ = ["install_checkpoint_loading", "tensorized_checkpoints", "restore_tensorized"]

ModuleType = TypeVar("ModuleType", bound=type)
_MARK = "_comera_checkpoint_loading"


def restore_tensorized(module: nn.Module, checkpoint: dict[str, Any]) -> bool:
    """Tensorize ``module`` as recorded in ``checkpoint`` if it is still dense; True if it did."""
    from .rank import tt_layers
    from .tensorize import tensorize
    from .tensorize_config import TensorizeConfig

    config = checkpoint.get("comera", {}).get("tensorize")
    if not config or tt_layers(module):
        return False
    tensorize(module, TensorizeConfig.from_dict(config).replace(init="random"))  # the values come from the checkpoint
    return True


def install_checkpoint_loading(cls: ModuleType) -> ModuleType:
    """Make ``cls.load_from_checkpoint`` accept tensorized checkpoints (idempotent)."""
    if cls.__dict__.get(_MARK):
        return cls
    original = cls.on_load_checkpoint

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        restore_tensorized(self, checkpoint)
        original(self, checkpoint)

    on_load_checkpoint.__doc__ = original.__doc__
    cls.on_load_checkpoint = on_load_checkpoint
    setattr(cls, _MARK, True)
    return cls


tensorized_checkpoints = install_checkpoint_loading
