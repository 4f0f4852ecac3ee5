"""What the callback tells a strategy, and what a strategy asks of the objects its captured step depends on.

Two structural protocols instead of duck typing: a strategy that keeps something sized by the
parameters (CUDA graphs, a DDP-wrapped sharded model) is a :class:`ResizeListener`, and
``ComeraCallback`` calls ``on_parameters_resized()`` after every prune; anything whose state a
captured training step freezes (the callback's stage and targets, or a module's) is a
:class:`GraphSignatureSource`, and ``CUDAGraphStrategy`` re-captures when its signature changes.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol, runtime_checkable

__all__ = ["GraphSignatureSource", "ResizeListener"]


@runtime_checkable
class ResizeListener(Protocol):
    """A strategy told when parameters were replaced by sliced ones (a prune that may have removed ranks)."""

    def on_parameters_resized(self) -> None:
        """Parameters may now be other ``nn.Parameter`` objects of other shapes."""


@runtime_checkable
class GraphSignatureSource(Protocol):
    """A callback or module whose state a captured training step freezes."""

    def cuda_graph_signature(self) -> Hashable:
        """A value that changes whenever a step captured before would now compute something else."""
