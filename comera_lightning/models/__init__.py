"""LightningModules for the paper's workloads and the reusable encoder they share."""

from comera_lightning.models.encoder import (
    Embeddings,
    Encoder,
    EncoderConfig,
    EncoderLayer,
    FeedForward,
    SelfAttention,
    TransformerEncoderModel,
    init_bert_weights,
)
from comera_lightning.models.codebert import MaskedLanguageModel
from comera_lightning.models.optim_setup import paper_adamw
from comera_lightning.models.transformer import SentencePairClassifier

__all__ = [
    "Embeddings",
    "Encoder",
    "EncoderConfig",
    "EncoderLayer",
    "FeedForward",
    "MaskedLanguageModel",
    "SelfAttention",
    "SentencePairClassifier",
    "TransformerEncoderModel",
    "init_bert_weights",
    "paper_adamw",
]

__all__ += ["DLRMClassifier"]


def __getattr__(name: str):
    # DLRMClassifier needs TorchRec (an optional extra): import it only when asked for.
    if name == "DLRMClassifier":
        from comera_lightning.models.dlrm import DLRMClassifier

        return DLRMClassifier
    raise AttributeError(f"module 'comera_lightning.models' has no attribute {name!r}")
