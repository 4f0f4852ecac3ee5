"""TTLinear: a linear layer whose weight lives in tensor-train form (docs/METHOD.md §1.1)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from comera_lightning.layers.base import TTModule
from comera_lightning.layers.contraction import chain_cost, contract_chain, tt_svd
from comera_lightning.layers.inference_cache import caching_allowed
from comera_lightning.layers.interface import LayerSummary, format_modes
from comera_lightning.layers.shapes import bond_rank_caps, cheapest, factorize, prod
from comera_lightning.layers.two_factor import gated_two_factor

__all__ = ["TTLinear"]


def _cores_per_side(num_cores: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(num_cores, int) and not isinstance(num_cores, bool):
        pair = (num_cores, num_cores)
    else:
        pair = tuple(num_cores)
    if len(pair) != 2 or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in pair):
        raise ValueError(f"num_cores must be a positive int or a pair (input cores, output cores), got {num_cores!r}.")
    return pair


def _check_modes(name: str, modes: Sequence[int], size: int) -> tuple[int, ...]:
    modes = tuple(int(m) for m in modes)
    if not modes or any(m < 1 for m in modes) or prod(modes) < size:
        raise ValueError(
            f"{name}={modes} must be positive ints whose product is >= {size} (got product {prod(modes) if modes else 0})."
        )
    return modes


class TTLinear(TTModule):
    """``y = x Wᵀ + b`` with ``W`` stored as a train of cores (input modes, then output modes).

    The forward never builds ``W``: it contracts the cores left of a split bond into ``A`` and
    those right of it into ``B`` and applies them to ``x`` in turn; the split and each chain's
    pairing order are chosen by FLOP count for the current batch and ranks. Sizes that do not
    factorise well are padded internally (inputs with zeros, outputs sliced off).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        max_rank: int | Sequence[int],
        in_modes: Sequence[int] | None = None,
        out_modes: Sequence[int] | None = None,
        num_cores: int | Sequence[int] = 3,
        gate_threshold: float = 1e-2,
        init_std: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        n_in, n_out = _cores_per_side(num_cores)
        in_modes = _check_modes("in_modes", in_modes, in_features) if in_modes is not None else factorize(in_features, n_in)
        out_modes = (
            _check_modes("out_modes", out_modes, out_features)
            if out_modes is not None
            else tuple(reversed(factorize(out_features, n_out)))  # mirror: large modes at both ends
        )
        sizes = in_modes + out_modes
        ranks = bond_rank_caps(sizes, max_rank)
        std = init_std if init_std is not None else math.sqrt(1.0 / (in_features + out_features))
        super().__init__(
            [(s,) for s in sizes], ranks, gate_threshold=gate_threshold, std=std, device=device, dtype=dtype
        )
        self.in_features, self.out_features = in_features, out_features
        self.in_modes, self.out_modes = in_modes, out_modes
        if bias:
            bound = 1.0 / math.sqrt(in_features)
            self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype).uniform_(-bound, bound))
        else:
            self.register_parameter("bias", None)

    # ------------------------------------------------------------------ conversions
    @classmethod
    def from_linear(cls, linear: nn.Linear, *, max_rank: int | Sequence[int], **kwargs) -> "TTLinear":
        """TT-SVD of ``linear``'s weight: exact at full rank, the best TT approximation below."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"from_linear expects an nn.Linear, got {type(linear).__name__}.")
        return cls.from_weight(linear.weight.T, linear.bias, max_rank=max_rank, **kwargs)

    @classmethod
    def from_weight(
        cls, weight_in_out: torch.Tensor, bias: torch.Tensor | None, *, max_rank: int | Sequence[int], **kwargs
    ) -> "TTLinear":
        """TT-SVD of an ``(in_features, out_features)`` weight of ``y = x W + b``: exact at full rank."""
        in_features, out_features = weight_in_out.shape
        layer = cls(
            in_features, out_features, bias is not None,
            max_rank=max_rank, device=weight_in_out.device, dtype=weight_in_out.dtype, **kwargs,
        )
        with torch.no_grad():
            padded = weight_in_out.new_zeros(prod(layer.in_modes), prod(layer.out_modes))
            padded[:in_features, :out_features] = weight_in_out
            layer.load_cores_(tt_svd(padded.reshape(layer.in_modes + layer.out_modes), layer.physical_ranks))
            if bias is not None:
                layer.bias.copy_(bias)
        return layer

    def token_cores(self) -> list[int]:
        """A vocabulary head's output cores (its columns are tokens); its input cores are shared by every token."""
        return list(range(len(self.in_modes), len(self.cores))) if self.vocabulary_layer else []

    @property
    def weight(self) -> torch.Tensor:
        """The dense ``(out_features, in_features)`` weight the train stands for.

        For code that reads a linear layer's weight directly (e.g. ``nn.TransformerEncoderLayer``'s fused
        inference path): contracted on every read in training, once at inference (cached until a parameter changes).
        """
        return self.cached("weight", self.weight_matrix)

    def weight_matrix(self) -> torch.Tensor:
        """The dense ``(out_features, in_features)`` weight the train represents (for export/tests)."""
        full = contract_chain(self.gated_cores()).reshape(prod(self.in_modes), prod(self.out_modes))
        return full[: self.in_features, : self.out_features].T

    def to_dense_module(self) -> nn.Linear:
        """The dense module this layer replaces (used by ``to_dense``)."""
        return self.to_linear()

    def to_linear(self) -> nn.Linear:
        """An ``nn.Linear`` computing the same function (masked gates included)."""
        weight = self.weight_matrix().detach()
        linear = nn.Linear(self.in_features, self.out_features, self.bias is not None, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(weight)
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear

    def dense_parameters(self) -> int:
        """Parameters of the equivalent ``nn.Linear``."""
        return self.in_features * self.out_features + (self.out_features if self.bias is not None else 0)

    #: What ``summary()`` calls this layer (a subclass standing for another dense type says so).
    summary_kind = "linear"

    def summary(self) -> LayerSummary:
        """Kind, (in, out), input→output modes, stored ranks."""
        modes = format_modes(self.in_modes, self.out_modes, "→")
        return LayerSummary(self.summary_kind, (self.in_features, self.out_features), modes, self.physical_ranks)

    # ------------------------------------------------------------------ forward
    def _split_cost(self, split: int, tokens: int, contract: bool = True) -> int:
        """Multiply-adds of the forward when the train is cut after core ``split - 1``.

        ``contract=False``: the two halves are already contracted (cached at inference), only the per-token cost counts.
        """
        sizes = [c.shape[1] for c in self.cores]
        bonds = [1, *self.physical_ranks, 1]
        n_in, rank = len(self.in_modes), bonds[split]
        if split <= n_in:  # contract part of the input, carry the rest: N·r·Q·(P + P_out)
            outer, inner = prod(sizes[:split]), prod(sizes[split:n_in])
            per_token = rank * inner * (outer + prod(self.out_modes))
        else:  # carry part of the output: N·r·O1·(P_in + O2)
            outer, inner = prod(sizes[n_in:split]), prod(sizes[split:])
            per_token = rank * outer * (prod(self.in_modes) + inner)
        if not contract:
            return tokens * per_token
        return tokens * per_token + chain_cost(bonds[: split + 1], sizes[:split]) + chain_cost(bonds[split:], sizes[split:])

    def best_split(self, tokens: int, contract: bool = True) -> int:
        """The cut (number of cores on the left) with the fewest multiply-adds for ``tokens`` rows."""
        return cheapest(range(1, len(self.cores)), lambda s: (self._split_cost(s, tokens, contract), abs(s - len(self.in_modes))))

    def halves(self, split: int, gate_apart: bool = False) -> tuple[torch.Tensor, ...]:
        """The cores left of bond ``split`` contracted to ``(1, ∏ left modes, r)``, those right of it to ``(r, ∏ right modes, 1)``.

        ``gate_apart``: bond ``split - 1``'s gate is not folded into the left half but returned third (``(r,)``).
        """
        if not gate_apart:
            cores = self.gated_cores()
            return contract_chain(cores[:split]), contract_chain(cores[split:])
        scales = self.bond_scales()
        cores = self.gated_cores(unfolded=split - 1, scales=scales)
        return contract_chain(cores[:split]), contract_chain(cores[split:]), scales[split - 1]

    def _two_factor(self, x2: torch.Tensor, split: int) -> torch.Tensor:
        """Training at the cut between input and output cores: ``x · A diag(g) · B + b`` as one autograd step
        (``two_factor.py``), ``g`` the split bond's gate, the other bonds' gates folded into their cores."""
        group = self.__dict__.get("_halves_group")  # layers of one layout contract their halves together (halves_group.py)
        found = group.halves(self, split) if group is not None and not torch.compiler.is_compiling() else None
        left, right, gate = found if found is not None else self.halves(split, gate_apart=True)
        rank = left.shape[-1]
        a, b = left.reshape(-1, rank), right.reshape(rank, -1)
        if a.shape[0] != self.in_features:  # padded modes (a slice costs a kernel in backward: only where needed)
            a = a[: self.in_features]
        if b.shape[1] != self.out_features:
            b = b[:, : self.out_features]
        return gated_two_factor(x2, a, gate, b, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"TTLinear expected input with last dim {self.in_features}, got shape {tuple(x.shape)}.")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        tokens = x2.shape[0]
        if 0 in self.physical_ranks:  # a bond pruned to rank 0: only the bias is left
            y = self.dead_output((tokens, self.out_features), x2)
            return (y + self.bias if self.bias is not None else y).reshape(*lead, self.out_features)
        if caching_allowed(self.training):  # inference: the halves are contracted once and reused
            split = self.best_split(tokens, contract=False)
            left, right = self.cached(("halves", split), lambda: self.halves(split))
        else:
            split = self.best_split(tokens)
            if split == len(self.in_modes):  # the usual cut: the split bond's gate stays apart, the rank intermediate is recomputed
                return self._two_factor(x2, split).reshape(*lead, self.out_features)
            left, right = self.halves(split)
        rank = left.shape[-1]
        p_in, p_out, n_in = prod(self.in_modes), prod(self.out_modes), len(self.in_modes)
        if split == n_in:
            a = left.reshape(p_in, rank)[: self.in_features]
            b = right.reshape(rank, p_out)[:, : self.out_features]
            if self.bias is not None:
                y = torch.addmm(self.bias, x2 @ a, b)
                return y.reshape(*lead, self.out_features)
            return (x2 @ a @ b).reshape(*lead, self.out_features)
        if torch.is_grad_enabled():  # a cut inside one side: its (tokens × modes × rank) intermediate recomputed in backward
            y = checkpoint(self._carried, x2, left, right, split, use_reentrant=False)
        else:
            y = self._carried(x2, left, right, split)
        y = y[:, : self.out_features]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def _carried(self, x2: torch.Tensor, left: torch.Tensor, right: torch.Tensor, split: int) -> torch.Tensor:
        """``x2`` through the halves of a cut inside the input or the output cores, a mode carried: ``(tokens, ∏ out modes)``."""
        rank, tokens = left.shape[-1], x2.shape[0]
        p_in, p_out = prod(self.in_modes), prod(self.out_modes)
        if split > len(self.in_modes):
            a = left.reshape(p_in, -1)[: self.in_features]  # (d_in, O1·r)
            t = (x2 @ a).reshape(-1, rank)  # (N·O1, r)
            return (t @ right.reshape(rank, -1)).reshape(tokens, p_out)
        if p_in != self.in_features:
            x2 = F.pad(x2, (0, p_in - self.in_features))
        outer = left.shape[1]
        xt = x2.reshape(tokens, outer, -1).transpose(1, 2)  # (N, Q, P)
        t = (xt @ left.reshape(outer, rank)).reshape(tokens, -1)  # (N, Q·r)
        inner = xt.shape[1]
        return t @ right.reshape(rank, inner, p_out).transpose(0, 1).reshape(inner * rank, p_out)

    def extra_repr(self) -> str:
        modes = "·".join(map(str, self.in_modes)) + " → " + "·".join(map(str, self.out_modes))
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"modes={modes}, ranks={list(self.physical_ranks)}, compression={self.compression_ratio():.1f}x"
        )
