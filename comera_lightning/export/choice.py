"""Which inference form (``forms.py``) each TT layer takes in an exported program, and why.

``prefer="size"`` (the default) keeps what was trained compressed: the smallest stored form. A
``TTLinear`` keeps its cores, or its two factors where those are no larger (with one core per side
the factors are the cores, and need no contraction per call); a ``TTEmbedding`` keeps its cores (a two-factor
table: its factors, ``forms.FactorsEmbedding``, one gather and one product per id instead of the chain's half-dozen
small ops); either becomes dense only where dense is smaller. No hot rows unless ``hot_rows`` asks for them.

``prefer="speed"`` expands where that measured faster (docs/INFERENCE_MEASURED.md, "Size or speed"): a
``TTLinear`` keeps its cores only where re-contracting them costs at most ``CONTRACTION_SHARE`` of
its two matmuls for the rows per call the example inputs send through it, else its two factors
(``r·(in + out)`` multiply-adds per row), or dense where ``r·(in + out) ≥ in·out``; a ``TTEmbedding``
keeps the hot rows it counted (its ``cache_rows``: 4 MiB by default) and, with more than two cores,
its two **half tables** instead of its cores: a miss is then one product of their rows, not the chain
of its core slices (``forms.CoresEmbedding``), measured 1.25–7.8× faster than the cores with the same
hot rows (3 and 4 cores, dim 16–64, rank 4–32, batch 1 and 4,096; a DLRM program 1.04–1.18×:
docs/INFERENCE_MEASURED.md, "Size or speed"), for more bytes (2.3 MB instead of 0.8 MB at 1M × 64, rank 32).
It becomes a dense table where the hot-row budget holds the whole table, or where dense is smaller.

``miss_tables`` (``embedding_form`` only): None (``prefer``'s default: cores for "size", half tables
for "speed" with more than two cores), True (half tables) or False (cores).

``hot_rows``: None (``prefer``'s default: none for "size", each table's ``cache_rows`` for
"speed"), False (none), True (each table's ``cache_rows``) or a budget in bytes per table. The hot
rows are the most frequent ids the table counted in training (at most ``cache_rows`` of them).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from comera_lightning.export.forms import CoresEmbedding, CoresLinear, FactorsEmbedding, factors_linear
from comera_lightning.export.report import format_bytes, module_bytes, tensor_bytes
from comera_lightning.layers import TTEmbedding, TTLinear
from comera_lightning.layers.contraction import chain_cost
from comera_lightning.layers.hot_rows import HotRowIndex
from comera_lightning.layers.shapes import is_two_factor_table
from comera_lightning.layers.tt_rows import chain_cost_per_id

__all__ = ["CONTRACTION_SHARE", "PREFER", "Chosen", "check_choice", "embedding_form", "linear_form"]

PREFER = ("size", "speed")
#: With ``prefer="speed"``, the largest share of a layer's matmul work that re-contracting its cores on every call may add.
CONTRACTION_SHARE = 0.1


class Chosen(NamedTuple):
    """A layer's inference module, the name of its form, and why it was chosen."""

    module: nn.Module
    form: str
    why: str


def check_choice(prefer: str, hot_rows: bool | int | None) -> None:
    """Refuse a ``prefer`` or ``hot_rows`` that ``export`` does not know, naming the valid values."""
    if prefer not in PREFER:
        raise ValueError(f"export: prefer={prefer!r} is not one of {PREFER}: 'size' keeps every TT layer in its compressed "
                         "form, 'speed' expands small tables and layers (large tables: hot rows and half tables) where that "
                         "measured faster.")
    if hot_rows is not None and not isinstance(hot_rows, bool) and (not isinstance(hot_rows, int) or hot_rows < 0):
        raise ValueError(f"export: hot_rows={hot_rows!r} must be None (prefer's default), True (each table's cache_rows), "
                         "False (none) or a budget in bytes per table (an int >= 0).")


def _contraction_cost(layer: TTLinear) -> int:
    bonds, sizes, split = [1, *layer.physical_ranks, 1], [c.shape[1] for c in layer.cores], len(layer.in_modes)
    return chain_cost(bonds[: split + 1], sizes[:split]) + chain_cost(bonds[split:], sizes[split:])


def _fastest_linear(layer: TTLinear, tokens: int, rank: int) -> tuple[str, str]:
    matmuls, dense = rank * (layer.in_features + layer.out_features), layer.in_features * layer.out_features
    if matmuls >= dense:
        return "dense", f"r·(in + out) = {matmuls:,} >= in·out = {dense:,} multiply-adds per row"
    if tokens and _contraction_cost(layer) <= CONTRACTION_SHARE * tokens * matmuls:
        return "cores", f"re-contracting them costs <= {CONTRACTION_SHARE:.0%} of the matmuls at {tokens:,} rows per call"
    if not tokens:
        return "factors", "rows per call unknown: no contraction per call"
    return "factors", f"re-contracting the cores would cost > {CONTRACTION_SHARE:.0%} of the matmuls at {tokens:,} rows per call"


def linear_form(layer: TTLinear, tokens: int = 0, prefer: str = "size") -> Chosen:
    """``layer``'s cores, two factors or dense ``nn.Linear`` (module docstring); ``tokens``: rows per call (0: unknown)."""
    with torch.no_grad():
        rank = layer.physical_ranks[len(layer.in_modes) - 1]
        bias = 0 if layer.bias is None else layer.out_features
        element = layer.cores[0].element_size()
        sizes = {"factors": rank * (layer.in_features + layer.out_features), "cores": sum(c.numel() for c in layer.cores),
                 "dense": layer.in_features * layer.out_features}  # in this order: on a tie, the one with less work per call
        sizes = {form: (count + bias) * element for form, count in sizes.items()}
        if prefer == "size":
            form = min(sizes, key=sizes.__getitem__)
            why = "smallest: " + ", ".join(f"{name} {format_bytes(n)}" for name, n in sorted(sizes.items(), key=lambda kv: kv[1]))
        else:
            form, why = _fastest_linear(layer, tokens, rank)
        module = CoresLinear(layer) if form == "cores" else factors_linear(layer) if form == "factors" else layer.to_linear()
    return Chosen(module, form, why)


def _hot_row_budget(layer: TTEmbedding, prefer: str, hot_rows: bool | int | None) -> int:
    """Rows of ``layer`` that ``hot_rows`` allows (at most the table)."""
    if hot_rows is None:
        hot_rows = prefer == "speed"
    if isinstance(hot_rows, bool):
        return layer.cache_rows if hot_rows else 0
    return min(layer.num_embeddings, hot_rows // (layer.embedding_dim * layer.cores[0].element_size()))


def _miss_work(layer: TTEmbedding, form: CoresEmbedding) -> str:
    """A miss's multiply-adds in ``form``'s half tables beside the chain of ``layer``'s cores."""
    product = form.left.shape[1] * form.right[0].numel()
    return f"a miss is one product of {product:,} multiply-adds, {chain_cost_per_id([c.shape for c in layer.cores]):,} through the cores"


def embedding_form(layer: TTEmbedding, prefer: str = "size", hot_rows: bool | int | None = None,
                   miss_tables: bool | None = None) -> Chosen:
    """``layer``'s cores or half tables (plus the hot rows ``hot_rows`` allows), or its dense ``nn.Embedding`` (module docstring)."""
    if miss_tables is None:  # two cores: the half tables are the cores (as large, no clear gain: 1.00x CPU)
        miss_tables = prefer == "speed" and len(layer.cores) > 2
    with torch.no_grad():
        budget = _hot_row_budget(layer, prefer, hot_rows)
        dense = layer.num_embeddings * layer.embedding_dim * layer.cores[0].element_size()
        if budget >= layer.num_embeddings:
            return Chosen(layer.to_embedding(), "dense", f"the hot-row budget holds the whole table ({layer.num_embeddings:,} rows)")
        index = None
        if budget and layer.has_counts():
            ids = layer.hot_ids()[:budget]
            index = HotRowIndex(ids, ids.numel())
        form = CoresEmbedding(layer, index, miss_tables)
        stored = module_bytes(form)
        kept = "half tables" if form.miss_tables else "cores"
        if stored >= dense:
            what = f"{kept} and hot rows" if form.num_hot_rows else kept
            return Chosen(layer.to_embedding(), "dense", f"smallest: dense {format_bytes(dense)} <= {what} {format_bytes(stored)}")
    if not form.num_hot_rows and not form.miss_tables and not form.dead and is_two_factor_table(layer.row_modes, layer.col_modes):
        factors = FactorsEmbedding(layer)
        return Chosen(factors, "factors", f"two factors {format_bytes(module_bytes(factors))}, dense {format_bytes(dense)}: "
                      "an id's row is one gather and one product")
    if form.num_hot_rows:
        cache = tensor_bytes([form.tags, form.position, form.hot_rows])
        why = f"{kept} {format_bytes(stored - cache)} + hot rows and their index {format_bytes(cache)} < dense {format_bytes(dense)}"
    else:
        why = f"{kept if form.miss_tables else 'smallest: cores'} {format_bytes(stored)}, dense {format_bytes(dense)}"
        why += " (no ids counted: no hot rows)" if budget else ""
    if form.miss_tables:
        why += f"; {_miss_work(layer, form)}"
    return Chosen(form, f"{kept} + {form.num_hot_rows:,} hot rows" if form.num_hot_rows else kept, why)
