"""The masked-LM encoders ``compress_pairs --model codebert`` and ``--model codebert_small`` compress: the package's
CodeBERT-like ``MaskedLanguageModel`` at ``configs/codebert_tiny.yaml``'s shape (d_model 128, 2 layers, untied
2,048-token table) or at ``configs/codebert_small.yaml``'s (d_model 384, 4 layers, untied 8,192-token table), on this
interpreter's Python standard library (``CodeCorpusDataModule``: a byte-level BPE trained on it, 15 % of the tokens
masked). Its accuracy is the masked-token accuracy; its loss the masked-token cross-entropy.
"""

from __future__ import annotations

import functools
from typing import Any

from benchmarks.quality.pair_models import PairModel, group_lrs
from comera_lightning.data.code import CodeCorpusDataModule
from comera_lightning.models.codebert import MaskedLanguageModel

#: ``configs/codebert_tiny.yaml``'s model, AdamW 1e-3 on every group with a linear decay over each run.
CODEBERT = {"d_model": 128, "num_layers": 2, "num_heads": 4, "d_ff": 512, "dropout": 0.1, "max_positions": 64,
            "tie_word_embeddings": False, "lr_cores": 1e-3, "lr_other": 1e-3, "lr_decay": "linear"}
#: ``configs/codebert_tiny.yaml``'s data: 200 files of the standard library in blocks of 64 tokens.
CODE_DATA = {"block_size": 64, "batch_size": 32, "eval_batch_size": 64, "vocab_size": 2048, "max_files": 200,
             "val_fraction": 0.05, "test_fraction": 0.05}

#: ``configs/codebert_small.yaml``'s model; one LR for every group (its 3e-4: 1e-3 left the dense model unstable).
CODEBERT_SMALL = {"d_model": 384, "num_layers": 4, "num_heads": 6, "d_ff": 1536, "dropout": 0.1, "max_positions": 128,
                  "tie_word_embeddings": False, "lr_cores": 3e-4, "lr_other": 3e-4, "warmup_steps": 60,
                  "lr_decay": "linear"}
#: ``configs/codebert_small.yaml``'s data: 600 files of the standard library in blocks of 128 tokens.
CODE_DATA_SMALL = {"block_size": 128, "batch_size": 16, "eval_batch_size": 64, "vocab_size": 8192, "max_files": 600,
                   "val_fraction": 0.05, "test_fraction": 0.05}


def _codebert(settings: dict[str, Any], data: CodeCorpusDataModule, width: int) -> MaskedLanguageModel:
    return MaskedLanguageModel(vocab_size=data.vocab_size, **{**settings, "d_model": width, "d_ff": 4 * width})


def _code_model(settings: dict[str, Any], data_settings: dict[str, Any]) -> PairModel:
    return PairModel(settings, settings["d_model"], settings["num_heads"], functools.partial(_codebert, settings),
                     group_lrs, CodeCorpusDataModule, data_settings)


CODE_MODELS = {"codebert": _code_model(CODEBERT, CODE_DATA), "codebert_small": _code_model(CODEBERT_SMALL, CODE_DATA_SMALL)}
