"""comera_lightning: rank-adaptive tensor-train training (CoMERA) for PyTorch Lightning."""

from .callback import ComeraCallback
from .checkpoint import tensorized_checkpoints
from .layers import TTEmbedding, TTLinear
from .optim import CAME
from .strategy import CUDAGraphStrategy
from .tensorize import TensorizeReport, tensorize, to_dense
from .tensorize_config import TensorizeConfig

__all__ = ["CAME", "CUDAGraphStrategy", "ComeraCallback", "TTEmbedding", "TTEmbeddingBagCollection", "TTLinear", "TensorizeConfig", "TensorizeReport", "tensorize", "tensorized_checkpoints", "to_dense"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """``TTEmbeddingBagCollection`` is imported lazily (torchrec is optional and slow to import)."""
    if name == "TTEmbeddingBagCollection":
        from .layers import TTEmbeddingBagCollection

        return TTEmbeddingBagCollection
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
