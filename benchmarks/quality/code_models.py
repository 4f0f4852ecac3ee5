"""The masked-LM encoder ``compress_pairs --model codebert`` compresses: the package's CodeBERT-like
``MaskedLanguageModel`` at ``configs/codebert_tiny.yaml``'s shape (d_model 128, 2 layers, untied 2,048-token table),
on this interpreter's Python standard library (``CodeCorpusDataModule``: a byte-level BPE trained on it, 15 % of the
tokens masked). Its accuracy is the masked-token accuracy; its loss the masked-token cross-entropy.
"""

from __future__ import annotations

from benchmarks.quality.pair_models import PairModel, group_lrs
from comera_lightning.data.code import CodeCorpusDataModule
from comera_lightning.models.codebert import MaskedLanguageModel

#: ``configs/codebert_tiny.yaml``'s model, AdamW 1e-3 on every group with a linear decay over each run.
CODEBERT = {"d_model": 128, "num_layers": 2, "num_heads": 4, "d_ff": 512, "dropout": 0.1, "max_positions": 64,
            "tie_word_embeddings": False, "lr_cores": 1e-3, "lr_other": 1e-3, "lr_decay": "linear"}
#: ``configs/codebert_tiny.yaml``'s data: 200 files of the standard library in blocks of 64 tokens.
CODE_DATA = {"block_size": 64, "batch_size": 32, "eval_batch_size": 64, "vocab_size": 2048, "max_files": 200,
             "val_fraction": 0.05, "test_fraction": 0.05}


def _codebert(data: CodeCorpusDataModule, width: int) -> MaskedLanguageModel:
    return MaskedLanguageModel(vocab_size=data.vocab_size, **{**CODEBERT, "d_model": width, "d_ff": 4 * width})


CODE_MODELS = {"codebert": PairModel(CODEBERT, CODEBERT["d_model"], CODEBERT["num_heads"], _codebert, group_lrs,
                                     CodeCorpusDataModule, CODE_DATA)}
