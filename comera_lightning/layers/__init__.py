"""Tensor-train layers in pure PyTorch (no Lightning)."""

from .base import PruneRecord, TTModule
from .tt_embedding import TTEmbedding
from .tt_linear import TTLinear

__all__ = ["PruneRecord", "TTEmbedding", "TTEmbeddingBagCollection", "TTLinear", "TTModule"]


def __getattr__(name: str):
    """Import ``TTEmbeddingBagCollection`` on first use: it imports torchrec, which is optional and slow."""
    if name == "TTEmbeddingBagCollection":
        from .tt_embedding_bag import TTEmbeddingBagCollection

        return TTEmbeddingBagCollection
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
