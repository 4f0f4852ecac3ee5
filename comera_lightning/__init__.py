"""comera_lightning: rank-adaptive tensor-train training (CoMERA) for PyTorch Lightning."""

from . import registry
from ._optional import lazy_exports
from .callback import ComeraCallback
from .checkpoint import tensorized_checkpoints
from .export_program import export
from .gate_optimizer import GateOptimizer
from .layers import TensorizedModule, TTEmbedding, TTLinear
from .optim import CAME
from .registry import Converter, register_converter
from .strategy import CUDAGraphStrategy
from .tensorize import TensorizeReport, tensorize, to_dense
from .tensorize_config import TensorizeConfig

__all__ = [
    "CAME", "CUDAGraphStrategy", "ComeraCallback", "Converter", "GateOptimizer", "TTEmbedding", "TTEmbeddingBagCollection",
    "TTLinear", "TensorizeConfig", "TensorizeReport", "TensorizedModule", "export", "register_converter", "registry", "tensorize",
    "tensorized_checkpoints", "to_dense",
]
__version__ = "0.1.0"

# TTEmbeddingBagCollection imports torchrec (optional and slow to import): loaded on first use.
__getattr__ = lazy_exports("comera_lightning.layers", {"TTEmbeddingBagCollection": "tt_embedding_bag"})
