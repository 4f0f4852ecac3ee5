"""Trained dense weights kept on disk, so that several compress runs (``compress.py``, ``compress_pairs.py``) share one
training."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = ["load_or_train"]


def load_or_train(path: Path, train: Callable[[], tuple[dict[str, Any], torch.nn.Module]]) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """(weights, result, whether they came from ``path``): the file's when it exists, else ``train()``'s (its result and
    trained module), written to ``path``."""
    if path.exists():
        saved = torch.load(path, weights_only=False)
        return saved["state"], saved["result"], True
    result, module = train()
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state": state, "result": result}, path)
    return state, result, False
