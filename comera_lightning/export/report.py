"""What ``export`` chose for each TT layer and what the program stores, as a table (``ExportReport``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["ExportReport", "LayerForm", "format_bytes", "module_bytes", "tensor_bytes"]


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of ``tensors``, each tensor counted once (tied weights appear under several names)."""
    seen = {(t.data_ptr(), t.numel(), t.dtype): t.numel() * t.element_size() for t in tensors}
    return sum(seen.values())


def module_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers."""
    return tensor_bytes([*module.parameters(), *module.buffers()])


def format_bytes(count: int) -> str:
    """``1.54 MB``, ``24.6 kB`` or ``512 B``."""
    if count >= 1e6:
        return f"{count / 1e6:.2f} MB"
    return f"{count / 1e3:.1f} kB" if count >= 1e3 else f"{count} B"


@dataclass(frozen=True)
class LayerForm:
    """One TT layer in the program: its name, the form it took, the bytes that form stores, and why."""

    name: str
    form: str
    nbytes: int
    why: str


@dataclass(frozen=True)
class ExportReport:
    """Per-layer forms of an exported program and its size beside the model's parameters.

    ``program_bytes``: the tensors the program stores (its ``state_dict`` and constants: what the .pt2 file holds
    besides the graph); ``parameter_bytes``: the parameters of the model given to ``export`` (the TT layers' cores
    and gates as trained).
    """

    prefer: str
    layers: tuple[LayerForm, ...]
    program_bytes: int
    parameter_bytes: int

    @property
    def program_over_parameters(self) -> float:
        """The program's tensors over the model's parameters (about 1 with ``prefer="size"`` and no hot rows)."""
        return self.program_bytes / max(1, self.parameter_bytes)

    def __str__(self) -> str:
        width = max([len("layer"), *(len(layer.name) for layer in self.layers)])
        forms = max([len("form"), *(len(layer.form) for layer in self.layers)])
        lines = [
            f'export (prefer="{self.prefer}"): the program stores {format_bytes(self.program_bytes)} of tensors, the model\'s '
            f"parameters are {format_bytes(self.parameter_bytes)} ({self.program_over_parameters:.2f}x)",
            f"  {'layer':<{width}}  {'form':<{forms}}  {'bytes':>9}  why",
        ]
        lines += [f"  {layer.name:<{width}}  {layer.form:<{forms}}  {format_bytes(layer.nbytes):>9}  {layer.why}" for layer in self.layers]
        return "\n".join(lines)
