"""Tensor-train layers in pure PyTorch (no Lightning)."""

from .._optional import lazy_exports
from .base import PruneRecord, TTModule
from .contract import LayerSummary, TensorizedModule
from .tt_embedding import TTEmbedding
from .tt_attention import TTMultiheadAttention
from .tt_linear import TTLinear

__all__ = ["LayerSummary", "PruneRecord", "TTEmbedding", "TTEmbeddingBagCollection", "TTLinear", "TTModule", "TTMultiheadAttention", "TensorizedModule"]

# TTEmbeddingBagCollection imports torchrec (optional and slow to import): loaded on first use.
__getattr__ = lazy_exports(__name__, {"TTEmbeddingBagCollection": "tt_embedding_bag"})
