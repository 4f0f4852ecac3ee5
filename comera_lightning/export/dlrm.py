"""The DLRM's dense-tensor entry point for export: no ``KeyedJaggedTensor``, so no TorchRec at load time.

``DenseInputDLRM(dense, ids)`` gives the same logits ``(B,)`` as ``DLRMClassifier(dense, kjt)``
for ``ids = kjt_to_ids(kjt, feature_names)``: ``ids`` is ``(B, F, L)`` int64, one row of at most
``L`` ids per sample and feature, in the order of ``feature_names(model)`` (the KJT keys of the
data module, ``cat_0 …`` for Criteo), padded with -1. Criteo has one id per feature: ``L = 1``.
Bags are pooled by their table's ``SUM``/``MEAN``; weighted KJTs are not supported.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from comera_lightning.export.choice import embedding_form
from comera_lightning.export.report import LayerForm, module_bytes
from comera_lightning.layers import TTEmbedding

__all__ = ["DenseInputDLRM", "dense_input_dlrm", "feature_names", "is_dlrm", "kjt_to_ids"]


def _dlrm_of(model: nn.Module) -> nn.Module | None:
    """The TorchRec ``DLRM`` inside ``model`` (a ``DLRMClassifier``) or ``model`` itself, else None."""
    inner = getattr(model, "model", model)
    names = {type(inner).__name__} | {t.__name__ for t in type(inner).__mro__}
    return inner if "DLRM" in names and hasattr(inner, "sparse_arch") else None


def is_dlrm(model: nn.Module) -> bool:
    """Whether ``model`` is a ``DLRMClassifier`` or a TorchRec ``DLRM``."""
    return _dlrm_of(model) is not None


def feature_names(model: nn.Module) -> list[str]:
    """The sparse features in the order the dense entry point takes them (the tables' configs, in order)."""
    ebc = _dlrm_of(model).sparse_arch.embedding_bag_collection
    return [name for config in ebc.embedding_bag_configs() for name in config.feature_names]


class DenseInputDLRM(nn.Module):
    """DLRM logits ``(B,)`` from ``dense (B, num_dense)`` and ``ids (B, F, L)`` (-1 = no id)."""

    def __init__(self, dlrm: nn.Module, tables: dict[str, nn.Module], feature_tables: list[tuple[str, bool]]) -> None:
        super().__init__()
        self.dense_arch, self.inter_arch, self.over_arch = (copy.deepcopy(m) for m in (dlrm.dense_arch, dlrm.inter_arch, dlrm.over_arch))
        self.tables = nn.ModuleDict(tables)
        self.feature_tables = feature_tables  # (table name, mean pooling) per feature, in input order

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        present = ids >= 0
        safe = ids.clamp(min=0)
        pooled = []
        for f, (table, mean) in enumerate(self.feature_tables):
            rows = self.tables[table](safe[:, f]) * present[:, f].unsqueeze(-1).to(dense.dtype)  # (B, L, D)
            bag = rows.sum(1)
            if mean:
                bag = bag / present[:, f].sum(1, keepdim=True).clamp(min=1).to(bag.dtype)
            pooled.append(bag)
        sparse = torch.stack(pooled, dim=1)  # (B, F, D)
        return self.over_arch(self.inter_arch(dense_features=self.dense_arch(dense), sparse_features=sparse)).squeeze(-1)


def dense_input_dlrm(model: nn.Module, prefer: str = "size", hot_rows: bool | int | None = None) -> tuple[DenseInputDLRM, list[LayerForm]]:
    """The dense-tensor entry point of ``model``'s DLRM, TT tables in their inference form (a copy), and those forms.

    ``prefer``, ``hot_rows``: as in ``export`` (``choice.py``).
    """
    from torchrec.modules.embedding_configs import PoolingType

    dlrm = _dlrm_of(model)
    ebc = dlrm.sparse_arch.embedding_bag_collection
    if ebc.is_weighted():
        raise ValueError("export: the DLRM's embedding collection is weighted; the dense entry point pools unweighted bags only.")
    tables: dict[str, nn.Module] = {}
    forms: list[LayerForm] = []
    for config in ebc.embedding_bag_configs():
        table = ebc.embedding_bags[config.name]
        if isinstance(table, TTEmbedding):
            table = copy.deepcopy(table).eval()
            table.prune_()  # dead ranks carry nothing: slice them out before storing the cores
            chosen = embedding_form(table, prefer, hot_rows)
            table = chosen.module
            forms.append(LayerForm(f"tables.{config.name}", chosen.form, module_bytes(table), chosen.why))
        elif isinstance(table, nn.EmbeddingBag):  # a dense TorchRec table
            table = nn.Embedding.from_pretrained(table.weight.detach().clone(), freeze=True)
        else:
            table = copy.deepcopy(table)
        tables[config.name] = table
    order = [(config.name, config.pooling == PoolingType.MEAN) for config in ebc.embedding_bag_configs() for _ in config.feature_names]
    return DenseInputDLRM(dlrm, tables, order).eval(), forms


def kjt_to_ids(kjt, names: list[str], length: int | None = None) -> torch.Tensor:
    """``(B, F, L)`` ids of a ``KeyedJaggedTensor`` for features ``names``, padded with -1 (``L``: longest bag)."""
    per_key = kjt.to_dict()
    missing = [n for n in names if n not in per_key]
    if missing:
        raise ValueError(f"features {missing} are missing from the KeyedJaggedTensor (keys: {kjt.keys()}).")
    if length is None:
        length = max(1, max(int(per_key[n].lengths().max()) if per_key[n].lengths().numel() else 0 for n in names))
    padded = [per_key[n].to_padded_dense(desired_length=length, padding_value=-1) for n in names]
    return torch.stack(padded, dim=1).long()
