"""comera_lightning: rank-adaptive tensor-train training (CoMERA) for PyTorch Lightning."""

from .layers import TTEmbedding, TTLinear
from .tensorize import TensorizeReport, tensorize, to_dense

__all__ = ["TTEmbedding", "TTLinear", "TensorizeReport", "tensorize", "to_dense"]
__version__ = "0.1.0"
