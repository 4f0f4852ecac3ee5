"""Tensor-train layers in pure PyTorch (no Lightning)."""

from .base import PruneRecord, TTModule
from .tt_embedding import TTEmbedding
from .tt_linear import TTLinear

__all__ = ["PruneRecord", "TTEmbedding", "TTLinear", "TTModule"]
