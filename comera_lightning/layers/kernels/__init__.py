"""Fused TT-table lookups: Triton kernels registered as ``torch.library`` custom ops, the torch path beside them.

A two-core TT-matrix table (or a longer train's two half tables) is two factors; :func:`two_factor_rows` gathers
each id's slices of both and multiplies them, :func:`two_factor_bags` also pools bags (sum or mean, weighted or
not). On CUDA tensors with Triton installed (``pip install 'comera_lightning[gpu]'``) one kernel does the whole
lookup, forward and backward (``triton_bags.py``, ``ops.py``); elsewhere the torch path runs (``reference.py``,
the kernels' reference in the tests, which run them on CPU under ``TRITON_INTERPRET=1``). On CUDA, where a step looks
up about as many ids as the table has rows, the whole table is built instead (``full_table.py``).
"""

from comera_lightning.layers.kernels.ops import (fused_kernels_apply, triton_usable, two_factor_bags, two_factor_rows,
                                                 whole_table_applies)
from comera_lightning.layers.kernels.reference import bags_reference, rows_reference

__all__ = ["bags_reference", "fused_kernels_apply", "rows_reference", "triton_usable", "two_factor_bags", "two_factor_rows",
           "whole_table_applies"]
