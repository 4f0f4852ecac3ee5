"""comera_lightning: rank-adaptive tensor-train training (CoMERA) for PyTorch Lightning.

The public API is ``__all__`` (the same list as docs/DESIGN_API.md, "Public API").
"""

from comera_lightning._optional import lazy_exports
from comera_lightning.callback import ComeraCallback, DistillConfig
from comera_lightning.checkpoint import tensorized_checkpoints
from comera_lightning.export import export
from comera_lightning.layers import TensorizedModule, TTEmbedding, TTLinear
from comera_lightning.optim import CAME, GateOptimizer
from comera_lightning.schedule import BudgetConfig
from comera_lightning.strategy import CUDAGraphStrategy
from comera_lightning.tensorize import TensorizeReport, tensorize, to_dense
from comera_lightning.tensorize.config import TensorizeConfig
from comera_lightning.tensorize.registry import Converter, register_converter

__all__ = [
    "BudgetConfig", "CAME", "CUDAGraphStrategy", "ComeraCallback", "Converter", "DistillConfig", "GateOptimizer", "TTEmbedding", "TTEmbeddingBagCollection",
    "TTLinear", "TensorizeConfig", "TensorizeReport", "TensorizedModule", "export", "register_converter", "tensorize",
    "tensorized_checkpoints", "to_dense",
]
__version__ = "0.1.0"

# TTEmbeddingBagCollection imports torchrec (optional and slow to import): loaded on first use.
__getattr__ = lazy_exports("comera_lightning.layers", {"TTEmbeddingBagCollection": "tt_embedding_bag"})
