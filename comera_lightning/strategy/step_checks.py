"""Checks around captured steps: what a run cannot capture, a non-finite loss caught one step late, the one device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["NonFiniteFlag", "NonFiniteStep", "accumulation_refusal", "graph_device", "run_refusal"]


def run_refusal(trainer: Any, precision_plugin: Any, optimizers: Sequence[torch.optim.Optimizer]) -> str | None:
    """Why the training steps of ``trainer``'s run cannot be captured on a GPU (``None``: they can)."""
    if not trainer.lightning_module.automatic_optimization:
        return "manual optimization: only Lightning's automatic optimization step can be captured"
    if trainer.accumulate_grad_batches > 1:
        return f"accumulate_grad_batches={trainer.accumulate_grad_batches}: gradient accumulation is not captured; use 1"
    if getattr(precision_plugin, "scaler", None) is not None:
        return "16-mixed precision: its GradScaler reads on the host whether to skip a step; use bf16-mixed or 32-true"
    if len(optimizers) != 1:
        return f"{len(optimizers)} optimizers: one is captured"
    if "capturable" not in optimizers[0].defaults:
        return (
            f"{type(optimizers[0]).__name__} has no 'capturable' option, so its step cannot run in a CUDA graph; "
            "use torch.optim.AdamW/Adam or comera_lightning.CAME"
        )
    return None


def accumulation_refusal(module: nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """Why a capture now would differ from eager steps: parameters outside ``optimizer`` whose ``.grad`` is not zero.

    Nothing clears their gradient, so it accumulates across steps; a graph reproduces that only if
    autograd added in place at capture, which depends on who else holds the tensor (another key's
    graph does). ComeraCallback's gates are outside too, but their own optimizer zeroes them after
    every step. One host sync; called once per capture.
    """
    inside = {id(p) for group in optimizer.param_groups for p in group["params"]}
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad and id(p) not in inside and p.grad is not None]
    if not named:
        return None
    nonzero = torch.stack([p.grad.detach().ne(0).any().to(p.device) for _, p in named]).tolist()
    names = [name for (name, _), bad in zip(named, nonzero) if bad]
    if not names:
        return None
    return (f"{names} require grad but no optimizer clears their .grad (it accumulates across steps, which a graph "
            "reproduces only if autograd happens to add in place); freeze them (requires_grad_(False)) or give them to "
            "the optimizer")


class NonFiniteFlag:
    """A device flag the captured step writes (its loss is not finite), read on the host one step later.

    :meth:`write` runs inside the step (captured, so every replay writes it). After a replay,
    :meth:`arm` queues a copy of the flag to host memory; :meth:`check` reads the copies of the
    steps before the one just launched, so the host never waits for the GPU's current step
    (``wait=True``: all of them, e.g. before a checkpoint is written).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.flag = torch.zeros((), dtype=torch.bool, device=device)
        cuda = device.type == "cuda"
        self._hosts = [torch.zeros((), dtype=torch.bool, pin_memory=cuda) for _ in range(2)]
        self._events = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self._pending: list[tuple[int, int]] = []  # (global step, host slot), oldest first
        self._next = 0

    def write(self, loss: Tensor) -> None:
        """Inside the step: set the flag when ``loss`` has a NaN or inf (no host sync)."""
        self.flag.copy_(~torch.isfinite(loss.detach()).all())

    def arm(self, step: int) -> None:
        """After a replay of global step ``step``: queue the flag's copy to the host."""
        if len(self._pending) == len(self._hosts):  # every slot unread: read them before one is reused
            self.check(wait=True)
        slot, self._next = self._next, (self._next + 1) % len(self._hosts)
        self._hosts[slot].copy_(self.flag, non_blocking=True)
        if self._events[slot] is not None:
            self._events[slot].record()
        self._pending.append((step, slot))

    def check(self, *, wait: bool = False) -> None:
        """Raise :class:`NonFiniteStep` for a flagged step: of every armed step if ``wait``, else of all but the newest."""
        ready = self._pending if wait else self._pending[:-1]
        self._pending = [] if wait else self._pending[-1:]
        for step, slot in ready:
            if self._events[slot] is not None:
                self._events[slot].synchronize()
            if bool(self._hosts[slot].numpy()):  # numpy(): a read of host memory, no device call
                self._pending = []
                raise NonFiniteStep(step)


class NonFiniteStep(FloatingPointError):
    """A replayed training step's loss was NaN or inf."""

    def __init__(self, step: int) -> None:
        super().__init__(
            f"CUDAGraphStrategy: the training loss was not finite (NaN or inf) at global step {step}, a replayed "
            "CUDA-graph step. Replayed steps are checked one step late, outside the graph, so that step's update "
            "already reached the weights and optimizer state in memory; training stopped before any later "
            "checkpoint was written, so the checkpoints on disk are from before it. Resume from the last one with "
            "a lower learning rate or gradient clipping, or check the data of that step."
        )
        self.step = step


def graph_device(cuda: bool, requested: Sequence[torch.device | int | str]) -> torch.device:
    """The one device to train on: the Trainer's requested CUDA device (refusing several; none: ``cuda:0``), or CPU."""
    if not cuda:
        return torch.device("cpu")
    if len(requested) > 1:
        raise ValueError(
            f"CUDAGraphStrategy trains on one device, but the Trainer asks for {len(requested)} "
            f"({', '.join(map(str, requested))}; devices='auto', the default, asks for every GPU). Use devices=1 or "
            "devices=[i] for GPU i, or strategy='ddp' for several."
        )
    if not requested:
        return torch.device("cuda", 0)
    device = requested[0]
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
