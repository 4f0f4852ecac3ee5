"""``--weights_from``: start a fit from a trained dense checkpoint's weights (compressing a trained model, docs/COMPRESS.md).

Unlike ``--ckpt_path``, which resumes a run (its optimizer, its step, its tensorized layers), this only puts the
dense weights in the module before the ``comera:`` section tensorizes it; with ``comera.tensorize.init: svd`` the
tensor trains start from the trained weights' SVD and the budget takes its trained-model schedule.
"""

from __future__ import annotations

from pathlib import Path

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info

from comera_lightning.callback.hooks import when_built

__all__ = ["load_dense_weights", "weights_when_built"]


def load_dense_weights(module: LightningModule, path: str | Path) -> None:
    """Load ``path``'s ``state_dict`` (a Lightning checkpoint, or a plain state dict) into ``module``; a clear error
    when the file is missing, is not a checkpoint, or holds other (e.g. tensorized) layers."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--weights_from {path}: no such file; give a checkpoint of a dense run (e.g. trained with --dense true).")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # a truncated or foreign file: pickle, zip or torch errors alike
        raise ValueError(f"--weights_from {path}: not a readable checkpoint ({type(error).__name__}: {error}).") from None
    state = saved.get("state_dict", saved) if isinstance(saved, dict) else None
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise ValueError(f"--weights_from {path}: holds no state_dict of tensors; give a Lightning checkpoint (.ckpt) of a dense run.")
    missing, unexpected = (sorted(keys) for keys in _mismatch(module, state))
    if missing or unexpected:
        tensorized = any(".cores." in key or ".gates." in key for key in unexpected)
        hint = ("it holds tensorized layers: resume it with --ckpt_path instead, or give a dense run's checkpoint"
                if tensorized else "it was written by another model or config")
        raise ValueError(f"--weights_from {path}: {hint} (missing {missing[:4]}, unexpected {unexpected[:4]}).")
    module.load_state_dict(state)
    rank_zero_info(f"--weights_from: the model starts from the weights of {path}.")


def _mismatch(module: LightningModule, state: dict[str, torch.Tensor]) -> tuple[set[str], set[str]]:
    own = set(module.state_dict())
    return own - set(state), set(state) - own


def weights_when_built(module: LightningModule, path: str | Path) -> None:
    """Load ``path`` now, or right after ``configure_model`` when the module creates its layers there (before the
    callback tensorizes them)."""
    when_built(module, lambda: load_dense_weights(module, path))
