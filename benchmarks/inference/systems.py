"""The systems ``inference.py`` compares, built the way the training comparisons build them.

Transformer (``transformer_speed.py``, comparison 1): the paper's 6-encoder SentencePairClassifier
(vocabulary 30,522, d_model 768, d_ff 3072, 128 tokens); ``comera`` is the early stage (tensorized
as ``configs/transformer.yaml`` does, all gates alive), ``comera_pruned`` the simulated late stage
(``keep_ranks_``: a third of every bond kept, then ``prune_``), ``exported`` the pruned model through
``comera_lightning.export``, loaded back from its file with ``torch.export.load``.

DLRM (``dlrm_memory.py``): TorchRec's DLRM at Criteo Kaggle scale (26 tables, 33.8M rows, dim 16);
``dense`` TorchRec's ``EmbeddingBagCollection``, ``comera_pruned`` a ``TTEmbeddingBagCollection``
(rank 32) with a third of every bond kept and pruned, ``exported`` its dense-tensor entry point.
Every model runs in eval mode; the TT layers serve their cached factors (``inference_mode``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.training import dlrm_memory, transformer_speed

SYSTEMS = {"transformer": ("dense", "comera", "comera_pruned", "exported"), "dlrm": ("dense", "comera_pruned", "exported")}
KEEP_FRACTION = 1 / 3
DLRM_DIM = 16


def transformer_args(seed: int = 0) -> argparse.Namespace:
    """The paper's sizes, as ``transformer_speed.py`` takes them."""
    return argparse.Namespace(vocab=30522, d_model=768, layers=6, heads=12, d_ff=3072, seq=128, seed=seed, device="cpu")


def transformer_batches(batch: int, count: int) -> list[tuple[Any, ...]]:
    batches = transformer_speed.make_batches(batch, count, transformer_args())
    return [(b["input_ids"], b["attention_mask"], b["token_type_ids"]) for b in batches]


def dlrm_batches(batch: int, count: int) -> list[Any]:
    return dlrm_memory.make_batches(batch, count, seed=0)


def dlrm_ids(batches: list[Any]) -> list[tuple[Any, Any]]:
    """The exported DLRM's inputs: dense features and ``(B, 26, 1)`` ids (converted outside the timed call)."""
    from comera_lightning.data.criteo import CRITEO_CAT_NAMES
    from comera_lightning.export.dlrm import kjt_to_ids

    return [(b.dense, kjt_to_ids(b.sparse, list(CRITEO_CAT_NAMES), length=1)) for b in batches]


def _prune_to_keep(model: Any) -> None:
    from comera_lightning.rank import prune_

    transformer_speed.keep_ranks_(model, KEEP_FRACTION)
    prune_(model)


def build_torch_model(workload: str, system: str) -> Any:
    """The model of ``system`` (not ``exported``) in eval mode, seeded."""
    import torch

    from comera_lightning import tensorize

    if workload == "transformer":
        model = transformer_speed.build_model(transformer_args())
        if system != "dense":
            tensorize(model, **transformer_speed.TENSORIZE)
        if system == "comera_pruned":
            _prune_to_keep(model)
        return model.eval()
    torch.manual_seed(0)
    options = argparse.Namespace(max_rank=32, num_cores=3, min_rows=1000)
    collection = dlrm_memory.build_collection("dense" if system == "dense" else "tt", DLRM_DIM, options)
    model = dlrm_memory.build_model(collection, DLRM_DIM)
    if system != "dense":
        _prune_to_keep(model)
    return model.eval()


def export_to(workload: str, path: Path) -> None:
    """Export the pruned model of ``workload`` to ``path`` (batch 2 example: the batch size stays dynamic).

    ``prefer="speed"``, as docs/INFERENCE_MEASURED.md's figures were measured (with cores and hot rows: "speed" stored a large
    table's cores then, its half tables since; ``export_prefer.py`` compares "size").
    """
    from comera_lightning import export

    model = build_torch_model(workload, "comera_pruned")
    example = transformer_batches(2, 1)[0] if workload == "transformer" else dlrm_ids(dlrm_batches(2, 1))[0]
    export(model, example, path, prefer="speed", overwrite=True)


def load_exported(path: Path) -> Any:
    import torch

    return torch.export.load(str(path)).module()


def call(workload: str, system: str, model: Any, inputs: Any) -> Any:
    """One inference call of ``model`` on one batch (``inputs`` as made for this system)."""
    if workload == "dlrm" and system != "exported":
        return model(dense_features=inputs.dense, sparse_features=inputs.sparse)
    return model(*inputs)


def inputs_for(workload: str, system: str, batch: int, count: int) -> list[Any]:
    if workload == "transformer":
        return transformer_batches(batch, count)
    batches = dlrm_batches(batch, count)
    return dlrm_ids(batches) if system == "exported" else batches
