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

from comera_lightning.rank import tt_layers
from comera_lightning.tensorize import tensorize
from comera_lightning.tensorize.config import RECORDS_BEFORE, TensorizeConfig

__all__ = ["install_checkpoint_loading", "tensorized_checkpoints", "restore_tensorized"]

ModuleType = TypeVar("ModuleType", bound=type)
_MARK = "_comera_checkpoint_loading"


def restore_tensorized(module: nn.Module, checkpoint: dict[str, Any]) -> bool:
    """Tensorize ``module`` as recorded in ``checkpoint`` if it is still dense; True if it did.

    Then check that the checkpoint's tensorized layers are the module's, so a mismatch (a dense
    checkpoint into a tensorized run, other ``target_modules``) fails here with one clear error
    instead of a list of raw missing keys.
    """
    config = checkpoint.get("comera", {}).get("tensorize")
    restored = bool(config) and not tt_layers(module)
    if restored:
        tensorize(module, TensorizeConfig.from_record(config).replace(init="random"))  # the values come from the checkpoint
    _check_tensorized_layers({name for name, _ in tt_layers(module)}, checkpoint.get("state_dict", {}), config)
    return restored


def _check_tensorized_layers(in_model: set[str], state_dict: dict[str, Any], config: dict[str, Any] | None) -> None:
    in_checkpoint = {key.rsplit(".cores.", 1)[0] for key in state_dict if ".cores." in key}
    if not state_dict or in_model == in_checkpoint:
        return
    if not in_checkpoint:
        raise ValueError(
            f"the checkpoint holds a dense model, this one has {len(in_model)} tensorized layers (e.g. {sorted(in_model)[:3]}). "
            "To start CoMERA from dense weights, load them into the dense module first (Model.load_from_checkpoint "
            "without ComeraCallback), then fit with ComeraCallback(tensorize=TensorizeConfig(init='svd')) and no ckpt_path."
        )
    raise ValueError(
        f"the checkpoint's tensorized layers differ from this model's: only in the checkpoint {sorted(in_checkpoint - in_model)}, "
        f"only in the model {sorted(in_model - in_checkpoint)}. The checkpoint was written with tensorize settings {config}; "
        "use the same settings (the CLI's comera.tensorize section) to resume or load it"
        + "".join(f"; it predates {k!r}: give {k}={v!r}" for k, v in RECORDS_BEFORE.items() if config is not None and k not in config)
        + "."
    )


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
