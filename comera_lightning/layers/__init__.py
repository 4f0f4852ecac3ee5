"""Tensor-train layers in pure PyTorch (no Lightning)."""

from comera_lightning._optional import lazy_exports
from comera_lightning.layers.base import PruneRecord, TTModule
from comera_lightning.layers.interface import LayerSummary, TensorizedModule
from comera_lightning.layers.tt_attention import TTMultiheadAttention
from comera_lightning.layers.tt_embedding import TTEmbedding
from comera_lightning.layers.tt_linear import TTLinear

__all__ = ["LayerSummary", "PruneRecord", "TTEmbedding", "TTEmbeddingBagCollection", "TTLinear", "TTModule", "TTMultiheadAttention", "TensorizedModule"]

# TTEmbeddingBagCollection imports torchrec (optional and slow to import): loaded on first use.
__getattr__ = lazy_exports(__name__, {"TTEmbeddingBagCollection": "tt_embedding_bag"})
