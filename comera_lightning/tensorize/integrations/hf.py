"""Hugging Face ``transformers``: ``Conv1D`` (GPT-2's attention and MLP projections) → :class:`TTConv1D`.

``Conv1D(nf, nx)`` is a linear layer that stores its weight transposed, ``(in, out)``, and computes
``y = x W + b``. Its TT form is a ``TTLinear`` of the same function that exports back to a
``Conv1D``. Imported by the registry once the program has imported ``transformers``.
"""

from __future__ import annotations

from typing import Any

import torch

from comera_lightning._optional import require
from comera_lightning.layers import TTLinear
from comera_lightning.tensorize.converters import LINEAR_OPTIONS, build_linear_like, linear_defaults
from comera_lightning.tensorize.registry import Converter, register_converter

__all__ = ["TTConv1D"]

Conv1D = require("transformers.pytorch_utils", "Tensorizing Hugging Face Conv1D layers").Conv1D


class TTConv1D(TTLinear):
    """A Hugging Face ``Conv1D`` in tensor-train form (same function; ``to_dense_module`` gives a ``Conv1D``)."""

    summary_kind = "conv1d"

    @property
    def weight(self) -> torch.Tensor:
        """The dense weight in ``Conv1D``'s layout, ``(in_features, out_features)``."""
        return self.cached("weight_in_out", lambda: self.weight_matrix().T)

    def to_dense_module(self) -> Conv1D:
        """A ``Conv1D`` computing the same function (masked gates included)."""
        weight = self.weight_matrix().detach()  # (out, in)
        conv = Conv1D(self.out_features, self.in_features).to(device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            conv.weight.copy_(weight.T)
            if self.bias is not None:
                conv.bias.copy_(self.bias)
            else:
                conv.bias.zero_()
        return conv


def _build_conv1d(module: Conv1D, options: dict[str, Any]) -> TTConv1D:
    return build_linear_like(TTConv1D, module.weight, module.bias, options)


register_converter(Conv1D, Converter("conv1d", _build_conv1d, LINEAR_OPTIONS, linear_defaults))
