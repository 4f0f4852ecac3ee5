"""LightningModules for the paper's workloads and the reusable encoder they share."""

from comera_lightning._optional import lazy_exports
from comera_lightning.models.codebert import MaskedLanguageModel
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

# DLRMClassifier needs TorchRec (an optional extra): imported on first use.
__getattr__ = lazy_exports("comera_lightning.models", {"DLRMClassifier": "dlrm"})
