"""GateOptimizer: the rank gates get their own Adam, whatever optimises the rest of the model.

Why: under the module's optimizer a gate moves at most about that optimizer's ``lr`` per step
(Adam-like) or by its tiny gradient (SGD), under its schedule and weight decay, so with a
typical ``AdamW(self.parameters(), lr=1e-3)`` and a cosine decay no gate ever reaches the pruning
threshold (docs/DESIGN_FLOW.md, step 1 of the data flow). ``attach`` takes the gates out of the module's
optimizers (their param groups stay, so LR schedulers keep working) and steps a plain Adam at
``lr`` without weight decay right after the optimizer that held them steps, so gradient
accumulation follows it. Limits: all gates follow the first optimizer that held any (with several
optimizers, under manual optimization); the module's gradient clipping does not cover them (Adam
normalises the step anyway); a step whose gate gradients are not finite is skipped. With
``follow_schedule`` the gates' ``lr`` is scaled as the host's LR scheduler scales its first group
(``lr / initial_lr``), so gates settle as the model anneals (not under CUDA-graph capture, where
the step's ``lr`` is fixed). Plain torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from comera_lightning._checks import check_number

__all__ = ["DEFAULT_GATE_LR", "IMPORTANCE_SMOOTHING", "GateOptimizer"]

#: AdaLoRA's smoothing of the sensitivity |g · ∂L/∂g| that ranks a gate's importance (``importance_of``).
IMPORTANCE_SMOOTHING = 0.85

#: Measured on unmodified modules (docs/USAGE.md, "Your own model": the drop-in benchmark): prunes within a few hundred steps.
DEFAULT_GATE_LR = 2e-2


class GateOptimizer:
    """Adam at ``lr`` (no weight decay) on the rank gates, stepped after the optimizer that held them."""

    def __init__(
        self, lr: float = DEFAULT_GATE_LR, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, follow_schedule: bool = False
    ) -> None:
        check_number("gate_lr", lr, 0.0, low_open=True)
        self.lr, self.betas, self.eps = float(lr), tuple(betas), float(eps)
        self.follow_schedule = follow_schedule
        self.frozen = False  # gates keep their values (their importance is still tracked): ``freeze``
        self.optimizer: torch.optim.Adam | None = None
        self.scaler: Any = None  # the GradScaler whose scale is on the gate gradients (attributes only: ddp_spawn pickles this)
        self._hook: Any = None
        self._pending: dict[str, Any] | None = None
        self.after_step: Callable[[], None] | None = None

    def attach(self, gates: Sequence[nn.Parameter], optimizers: Sequence[torch.optim.Optimizer],
               after_step: Callable[[], None] | None = None) -> None:
        """Take ``gates`` out of ``optimizers`` and start stepping them after the first optimizer that held any;
        ``after_step`` runs after every step that moved them (the callback latches the masks there, once for all layers)."""
        self.detach()
        self.after_step = after_step
        gates = [g for g in gates if g.requires_grad]
        if not gates:
            return
        held = [opt for opt in optimizers if _remove_parameters(opt, gates)]
        host = held[0] if held else (optimizers[0] if optimizers else None)
        if host is None:
            raise ValueError("ComeraCallback found no optimizer to follow: configure_optimizers must return one.")
        capturable = gates[0].is_cuda  # a CUDA-graph capture may include this step
        self.optimizer = torch.optim.Adam(gates, lr=self.lr, betas=self.betas, eps=self.eps, capturable=capturable)
        if self._pending is not None and _state_fits(self._pending, gates):  # else: another model's gates
            self._load(self._pending)
        self._pending = None
        self._hook = host.register_step_post_hook(self._after_host_step)

    def _load(self, state: dict[str, Any]) -> None:
        """Load Adam's moments; the settings (lr, betas, eps, capturable) stay the current ones, not the saved ones."""
        self.optimizer.load_state_dict(state)
        for group in self.optimizer.param_groups:
            group.update(lr=self.lr, betas=self.betas, eps=self.eps, capturable=self.optimizer.defaults["capturable"])

    def follow_scaler(self, scaler: Any) -> None:
        """Undo this ``torch.amp.GradScaler``'s scale on the gate gradients (None or disabled: nothing to undo)."""
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None

    def grad_scale(self) -> float | None:
        """The scale on the gate gradients (None: unscaled)."""
        return self.scaler.get_scale() if self.scaler is not None else None

    def _after_host_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.follow_schedule and not self.optimizer.defaults["capturable"]:
            host = optimizer.param_groups[0]
            scale = host["lr"] / host["initial_lr"] if host.get("initial_lr") else 1.0
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr * float(scale)
        self.step()

    def detach(self) -> None:
        """Stop following the host optimizer; the gates' Adam state is kept for ``state_dict`` and the next ``attach``."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.optimizer is not None:
            self._pending, self.optimizer = self.optimizer.state_dict(), None

    def step(self) -> None:
        """One Adam step on the gates, then clear their gradients.

        Under a gradient scaler the gradients are unscaled first, and a step with an inf/NaN
        gradient is skipped (a fused optimizer's step runs even on an overflow step).
        """
        scale = self.grad_scale()
        if scale is not None:
            grads = [g.grad for g in self.parameters() if g.grad is not None]
            torch._foreach_div_(grads, scale)
            if not all(bool(torch.isfinite(g).all()) for g in grads):
                self.zero_grad()
                return
        held = [g for g in self.parameters() if g.grad is not None]
        sensitivity = torch._foreach_mul([g.detach() for g in held], [g.grad for g in held]) if held else []
        if sensitivity:
            torch._foreach_abs_(sensitivity)
        if not self.frozen:
            self.optimizer.step()
        elif not self.optimizer.state:  # Adam never stepped (one dict lookup, not one per gate, on every held step)
            self._start_state()
        self._track(held, sensitivity)
        self.zero_grad()
        if not self.frozen and self.after_step is not None:
            self.after_step()

    def _start_state(self) -> None:
        """Frozen before Adam ever stepped (``freeze`` promises the importance is still tracked): one step at lr 0 sets
        its state up, which the importance lives in, without moving a gate."""
        lrs = [group["lr"] for group in self.optimizer.param_groups]
        for group in self.optimizer.param_groups:
            group["lr"] = 0.0
        self.optimizer.step()
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr

    def freeze(self, frozen: bool = True) -> None:
        """Stop (or resume) moving the gates; their importance is still tracked (a budget decides which ranks go)."""
        self.frozen = frozen

    def _track(self, gates: list[nn.Parameter], sensitivity: list[torch.Tensor]) -> None:
        """Fold this step's sensitivities into each gate's smoothed importance (kept in Adam's state), in two
        multi-tensor kernels."""
        running, fresh = [], []
        for gate, value in zip(gates, sensitivity):
            state = self.optimizer.state[gate]
            if "importance" in state:
                running.append(state["importance"])
                fresh.append(value)
            elif state:  # Adam sets its state up at its first step: until then an entry of ours would stop it doing so
                state["importance"] = value
        if running:
            torch._foreach_mul_(running, IMPORTANCE_SMOOTHING)
            torch._foreach_add_(running, fresh, alpha=1 - IMPORTANCE_SMOOTHING)

    def importance_of(self, gate: nn.Parameter) -> torch.Tensor | None:
        """Each index's smoothed sensitivity |g · ∂L/∂g| (the first-order loss change if it died); None before a step.

        Kept in the gates' Adam state, so pruning slices it and checkpoints carry it.
        """
        if self.optimizer is None:
            return None
        return self.optimizer.state.get(gate, {}).get("importance")

    @torch.no_grad()
    def rebase_(self, gate: nn.Parameter, strength: torch.Tensor) -> None:
        """``gate``'s bond was re-expressed in a new basis (``TTModule.align_bond_``): Adam restarts on it (moments and
        step), and its importance is the bond's total shared in proportion to ``strength`` (the squared singular values)."""
        state = self.optimizer.state.get(gate) if self.optimizer is not None else None
        if not state:
            return
        importance = state.get("importance")
        for key, value in state.items():
            if key != "importance" and torch.is_tensor(value):
                value.zero_()  # in place, ``step`` too: a captured graph holds these tensors
        if importance is not None:
            share = strength.double() / strength.double().sum().clamp(min=torch.finfo(torch.float64).tiny)
            importance.copy_(share.to(importance) * importance.sum())

    def zero_grad(self) -> None:
        """Clear the gates' gradients (in place on CUDA, where a captured graph keeps their memory; a plain loop, not
        ``Optimizer.zero_grad``, which a compiled step may not trace)."""
        if self.optimizer is None:
            return
        in_place = self.optimizer.defaults["capturable"]
        for gate in self.parameters():
            if gate.grad is None:
                continue
            if in_place:
                gate.grad.zero_()
            else:
                gate.grad = None

    def parameters(self) -> list[nn.Parameter]:
        """The gates now (pruning swaps them for sliced ones)."""
        return [p for group in self.optimizer.param_groups for p in group["params"]] if self.optimizer else []

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizer to slice along when ranks are pruned (empty before ``attach``)."""
        return [self.optimizer] if self.optimizer is not None else []

    def state_dict(self) -> dict[str, Any] | None:
        """Adam's state of the gates (None before the first ``attach``)."""
        return self.optimizer.state_dict() if self.optimizer is not None else self._pending

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore ``state_dict()`` output, now or at the next ``attach``."""
        if state is not None and self.optimizer is not None:
            self._load(state)
        else:
            self._pending = state


def _remove_parameters(optimizer: torch.optim.Optimizer, params: Sequence[nn.Parameter]) -> bool:
    """Drop ``params`` from ``optimizer``'s param groups and state; whether it held any of them."""
    ids = {id(p) for p in params}
    held = False
    for group in optimizer.param_groups:
        held = held or any(id(p) in ids for p in group["params"])
        group["params"] = [p for p in group["params"] if id(p) not in ids]
    for p in params:
        optimizer.state.pop(p, None)
    return held


def _state_fits(state: dict[str, Any], gates: Sequence[nn.Parameter]) -> bool:
    """Whether a saved Adam state belongs to gates of these shapes."""
    saved = state.get("state", {})
    for index, gate in enumerate(gates):
        moment = saved.get(index, {}).get("exp_avg")
        if moment is not None and moment.shape != gate.shape:
            return False
    return len(state.get("param_groups", [{}])[0].get("params", [])) == len(gates)
