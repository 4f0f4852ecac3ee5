"""The systems ``dlrm_memory.py`` compares: TorchRec's DLRM on dense or TT tables, its optimizer, one training step, the batches."""

from __future__ import annotations

import argparse
from typing import Any

SYSTEMS = ("dense", "tt", "tt_from_dense", "tt_from_meta")
OPTIMIZERS = ("adagrad", "sgd", "adamw")
NUM_DENSE_FEATURES = 13


def make_batches(batch_size: int, count: int, seed: int) -> list[Any]:
    """``count`` synthetic Criteo batches (one Zipf-like id per feature) at the Kaggle cardinalities."""
    from comera_lightning.data.criteo import SyntheticCriteoDataModule

    dataset = SyntheticCriteoDataModule(batch_size=batch_size, num_batches=count, seed=seed).dataset("train")
    return [dataset[i] for i in range(count)]


def unique_fraction(batch: Any) -> float:
    """Mean over features of (distinct ids / ids) in one batch: how much deduplication can save."""
    import torch

    kjt = batch.sparse
    fractions = [torch.unique(v).numel() / max(1, v.numel()) for v in kjt.values().split(kjt.length_per_key())]
    return sum(fractions) / len(fractions)


def build_collection(system: str, dim: int, args: argparse.Namespace) -> Any:
    """The 26-table collection of ``system`` at embedding dim ``dim``."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from comera_lightning import TTEmbeddingBagCollection
    from comera_lightning.data.click_logs import embedding_bag_configs
    from comera_lightning.data.criteo import CRITEO_CAT_NAMES, CRITEO_KAGGLE_TABLE_SIZES

    configs = embedding_bag_configs(CRITEO_CAT_NAMES, CRITEO_KAGGLE_TABLE_SIZES, dim)
    tt_options = {"max_rank": args.max_rank, "num_cores": args.num_cores, "min_rows": args.min_rows}
    if system == "dense":
        return EmbeddingBagCollection(tables=configs)
    if system == "tt":
        return TTEmbeddingBagCollection(configs, **tt_options)
    dense = EmbeddingBagCollection(tables=configs, device="meta" if system == "tt_from_meta" else None)
    collection = TTEmbeddingBagCollection.from_ebc(dense, init="random", **tt_options)
    del dense
    return collection


def build_model(collection: Any, dim: int) -> Any:
    """TorchRec DLRM around ``collection``: dense arch 13-512-256-dim, over arch 512-256-1."""
    from torchrec.models.dlrm import DLRM

    return DLRM(
        embedding_bag_collection=collection,
        dense_in_features=NUM_DENSE_FEATURES,
        dense_arch_layer_sizes=[512, 256, dim],
        over_arch_layer_sizes=[512, 256, 1],
    )


def make_optimizer(name: str, params: Any, lr: float) -> Any:
    """The optimizer both systems use (torch defaults otherwise: single-tensor loops on CPU)."""
    import torch

    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    return torch.optim.AdamW(params, lr=lr)


def train_step(model: Any, optimizer: Any, batch: Any) -> float:
    """Forward, BCE-with-logits, backward, optimizer step, gradients freed; returns the loss."""
    import torch.nn.functional as F

    logits = model(dense_features=batch.dense, sparse_features=batch.sparse).squeeze(-1)
    loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())
