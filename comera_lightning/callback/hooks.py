"""How the callback changes a LightningModule's methods for a run: wrappers Lightning and torch.compile accept."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden

__all__ = ["non_finite_error", "replace_loss", "unwrap_methods", "when_built", "wrap_method"]


def replace_loss(output: Any, objective: Any) -> Any:
    """``training_step``'s output with its loss turned into ``objective(loss)``."""
    if output is None:
        return None
    if isinstance(output, torch.Tensor):
        return objective(output)
    if isinstance(output, Mapping) and "loss" in output:
        return {**output, "loss": objective(output["loss"]), "task_loss": output["loss"].detach()}
    raise TypeError(f"training_step returned {type(output).__name__}; ComeraCallback needs a loss tensor or a dict with a 'loss' key.")


def non_finite_error(task_loss: torch.Tensor, trainer: pl.Trainer | None) -> FloatingPointError:
    """The error a non-finite task loss raises, saying where and what to try."""
    where = f"global step {trainer.global_step}, epoch {trainer.current_epoch}" if trainer else "this step"
    return FloatingPointError(
        f"ComeraCallback: the training loss is {task_loss.detach().float().flatten()[0].item()} at {where}. "
        "Training stopped before this step's backward, so weights and saved checkpoints are not affected. "
        "Lower the learning rate, enable gradient clipping, or check the data/inputs of this batch."
    )


def wrap_method(pl_module: pl.LightningModule, name: str, after: Any) -> None:
    """Make ``pl_module.<name>`` return ``after(original(...))`` (once, however often it is called)."""
    original = pl_module.__dict__.get(f"_comera_original_{name}") or getattr(pl_module, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return after(original(*args, **kwargs))

    # Lightning chooses the arguments it passes from the signature (with `self`, as of the function), so
    # give it the original's; no functools.wraps: torch.compile fails following __wrapped__ to a bound method.
    wrapped.__name__, wrapped.__doc__ = name, original.__doc__
    wrapped.__signature__ = inspect.signature(getattr(original, "__func__", original))
    pl_module.__dict__[f"_comera_original_{name}"] = original
    setattr(pl_module, name, wrapped)


def unwrap_methods(pl_module: pl.LightningModule) -> None:
    """Give the module back every method ``wrap_method`` replaced."""
    for key in [k for k in pl_module.__dict__ if k.startswith("_comera_original_")]:
        del pl_module.__dict__[key]
        pl_module.__dict__.pop(key[len("_comera_original_"):], None)


def when_built(pl_module: pl.LightningModule, action: Callable[[], Any]) -> None:
    """Run ``action()`` now, or right after ``configure_model`` when the module creates its layers there."""
    if is_overridden("configure_model", pl_module, pl.LightningModule):
        wrap_method(pl_module, "configure_model", lambda result: action())
    else:
        action()
