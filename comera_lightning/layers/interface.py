"""TensorizedModule: the contract every tensorized layer implements (docs/DESIGN_API.md, "Extension points").

A tensorized layer stands for a dense module (``nn.Linear``, ``nn.Embedding``, a TorchRec
``EmbeddingBagCollection``, ...) and holds its weights as one or more tensor trains
(:class:`~comera_lightning.layers.base.TTModule`, which the rank machinery gates and prunes).
``tensorize`` reports on it through ``summary()``, ``to_dense`` turns it back through
``to_dense_module()``, and compression is counted through ``dense_parameters()``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from torch import nn

__all__ = ["LayerSummary", "TensorizedModule", "format_modes"]


@dataclass(frozen=True)
class LayerSummary:
    """How a tensorized layer describes itself in a ``TensorizeReport`` row."""

    kind: str  # "linear", "embedding", "ebc", "conv1d", ...
    shape: tuple[int, int]
    modes: str
    ranks: tuple[int, ...]


def format_modes(left: tuple[int, ...], right: tuple[int, ...], sep: str) -> str:
    """``"8·8·12→8·8·48"``-style text for two mode tuples."""
    return "·".join(map(str, left)) + sep + "·".join(map(str, right))


class TensorizedModule(nn.Module, metaclass=abc.ABCMeta):
    """A module that stands for a dense module and keeps its weights in tensor-train form."""

    @abc.abstractmethod
    def dense_parameters(self) -> int:
        """Parameters of the dense module this one replaces."""

    @abc.abstractmethod
    def to_dense_module(self) -> nn.Module:
        """The equivalent dense module (same function, masked gates included)."""

    @abc.abstractmethod
    def summary(self) -> LayerSummary:
        """Kind, shape, modes and stored ranks, for reports."""

    def num_parameters(self) -> int:
        """Parameters this layer holds now (cores, gates, biases, small dense parts)."""
        return sum(p.numel() for p in self.parameters())

    def compression_ratio(self) -> float:
        """Dense parameters divided by the parameters held now."""
        return self.dense_parameters() / max(1, self.num_parameters())
