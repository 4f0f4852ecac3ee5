"""What a captured optimizer step reads from the param groups: learning rates as device tensors, the rest frozen.

A CUDA graph bakes every Python number it saw into its kernels. :class:`GraphedOptimizer` keeps
each group's ``lr`` in one device tensor the graph reads (a float written by Lightning's manual
warm-up or a scheduler is copied in before every step), and lists the other hyper-parameters
(betas, eps, weight decay, momentum...) so that a change re-captures instead of being ignored.
:func:`plain_checkpoint` takes the capture settings back out of a checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from comera_lightning.strategy.capture import make_capturable_

__all__ = ["GraphedOptimizer", "plain_checkpoint"]


class GraphedOptimizer:
    """An optimizer made capturable (``make_capturable_``) whose settings can be put back (:meth:`restore`)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.original_capturable = bool(optimizer.defaults.get("capturable", False))
        self._group_capturable = {id(g): bool(g.get("capturable", False)) for g in optimizer.param_groups}
        lrs = make_capturable_(optimizer)
        self._lrs: dict[int, Tensor] = {id(optimizer.param_groups[i]): lr for i, lr in lrs.items()}

    def sync(self) -> None:
        """Point every group's ``lr`` at its device tensor, copying in a value set since (call outside a capture)."""
        for group in self.optimizer.param_groups:
            if not group["params"]:
                continue
            lr = self._lrs.get(id(group))
            if lr is None:  # a group added by add_param_group since training started
                self._group_capturable.setdefault(id(group), self.original_capturable)  # its default was ours
                group["capturable"] = True
                lr = self._lrs[id(group)] = torch.zeros((), dtype=torch.float32, device=group["params"][0].device)
            if group["lr"] is not lr:
                lr.copy_(group["lr"]) if isinstance(group["lr"], Tensor) else lr.fill_(float(group["lr"]))
                group["lr"] = lr

    def frozen(self) -> dict[str, Any]:
        """The hyper-parameters a graph freezes, by ``group<i>.<name>`` (tensors other than ``lr`` by identity)."""
        frozen: dict[str, Any] = {"param_groups": len(self.optimizer.param_groups)}
        for i, group in enumerate(self.optimizer.param_groups):
            for name, value in group.items():
                if name not in ("params", "lr"):
                    frozen[f"group{i}.{name}"] = ("tensor", id(value)) if isinstance(value, Tensor) else value
            frozen[f"group{i}.params"] = tuple(map(id, group["params"]))
        return frozen

    def restore(self) -> None:
        """Give the optimizer back as it was: float learning rates, its own ``capturable`` setting."""
        self.optimizer.defaults["capturable"] = self.original_capturable
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], Tensor):
                group["lr"] = float(group["lr"])
            group["capturable"] = self._group_capturable.get(id(group), self.original_capturable)
        self._lrs.clear()

    def plain_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` (this optimizer's ``state_dict()``) as it would be without capture settings; ``state`` is not changed."""
        groups = [
            {**g, "lr": _number(g["lr"]), "capturable": self._group_capturable.get(id(live), self.original_capturable)}
            for g, live in zip(state["param_groups"], self.optimizer.param_groups)
        ]
        per_param = {k: {**s, "step": s["step"].cpu()} if isinstance(s.get("step"), Tensor) else s for k, s in state["state"].items()}
        return {**state, "state": per_param, "param_groups": groups}


def plain_checkpoint(checkpoint: dict[str, Any], graphed: GraphedOptimizer | None) -> dict[str, Any]:
    """A copy of a Lightning checkpoint whose optimizer and LR-scheduler states hold floats and no capture settings."""
    checkpoint = dict(checkpoint)
    states = checkpoint.get("optimizer_states")
    if graphed is not None and states:
        checkpoint["optimizer_states"] = [graphed.plain_state(states[0]), *states[1:]]
    if checkpoint.get("lr_schedulers"):
        checkpoint["lr_schedulers"] = [
            {k: [_number(v) for v in value] if k in ("_last_lr", "base_lrs") and isinstance(value, list) else value
             for k, value in s.items()}
            for s in checkpoint["lr_schedulers"]
        ]
    return checkpoint


def _number(value: Any) -> Any:
    return float(value) if isinstance(value, Tensor) else value
