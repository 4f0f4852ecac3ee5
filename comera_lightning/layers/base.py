"""What every tensor-train layer shares: cores, rank gates, masking, pruning, resizing on load.

A train of ``K`` cores ``G_k`` of shape ``(r_{k-1}, *modes_k, r_k)`` (``r_0 = r_K = 1``) carries
a gate vector ``g_k`` on each internal bond (docs/METHOD.md §2): the layer uses
``G_1 diag(g_1) G_2 diag(g_2) ⋯ G_K``. A gate at or below ``gate_threshold`` is dead: it
contributes nothing and gets no gradient, and its ``alive`` flag (a buffer) is cleared so it
never comes back. ``prune_`` slices dead indices out physically, so compute and memory fall.
``align_bond_`` re-expresses a bond in its SVD basis (the tensor unchanged), so that a cut takes its weakest directions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from comera_lightning.layers.bond_basis import svd_basis
from comera_lightning.layers.contraction import contract_chain
from comera_lightning.layers.gate_masks import grad_masked, rule_masks
from comera_lightning.layers.inference_cache import InferenceCache, caching_allowed
from comera_lightning.layers.interface import TensorizedModule

__all__ = ["TTModule", "PruneRecord"]


@dataclass(frozen=True)
class PruneRecord:
    """``prune_`` replaced ``old`` by ``param``, keeping ``index`` along ``dim`` (for optimizer state)."""

    old: nn.Parameter
    param: nn.Parameter
    dim: int
    index: torch.Tensor


def _listed(params: nn.ParameterList) -> list[torch.Tensor]:
    """A ParameterList's tensors, read from its dict (iterating one indexes it item by item, and slicing
    builds a new ParameterList: lookups ask for ranks and cores several times per call). Falls back to
    iterating where a wrapper took the tensors out of the dict."""
    values = list(params._parameters.values())
    return values if len(values) == len(params) else list(params)


def _fresh_parameter(value: torch.Tensor, like: nn.Parameter) -> nn.Parameter:
    """A new Parameter (new autograd identity) holding ``value``.

    Resizing through ``param.data = ...`` would keep autograd's cached gradient accumulator,
    which remembers the old shape: any graph still alive from before (reference cycles
    collected later) then breaks the next backward. A new object avoids that for good.
    """
    return nn.Parameter(value.detach().clone(), requires_grad=like.requires_grad)


class TTModule(TensorizedModule):
    """Base class of one tensor train: holds its cores (``self.cores``) and rank gates (``self.gates``)."""

    #: Rows or columns indexed by tokens (a token table, a vocabulary head): its cores take longer steps (optim/core_steps.py).
    vocabulary_layer = False
    #: A bond may lose its last live index (the layer then outputs its bias only); False keeps each bond's strongest gate.
    allow_rank0 = False

    def __init__(
        self,
        core_modes: Sequence[Sequence[int]],
        ranks: Sequence[int],
        *,
        gate_threshold: float,
        std: float,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if len(ranks) != len(core_modes) - 1:
            raise ValueError(f"{len(core_modes)} cores need {len(core_modes) - 1} bond ranks, got {list(ranks)}")
        if not (isinstance(gate_threshold, (int, float)) and 0 <= gate_threshold < 1):
            raise ValueError(f"gate_threshold must be a number in [0, 1), got {gate_threshold!r}.")
        self.core_modes = [tuple(int(m) for m in modes) for modes in core_modes]
        self.gate_threshold = float(gate_threshold)
        bonds = (1, *ranks, 1)
        factory = {"device": device, "dtype": dtype}
        self.cores = nn.ParameterList(
            nn.Parameter(torch.empty(bonds[k], *modes, bonds[k + 1], **factory)) for k, modes in enumerate(self.core_modes)
        )
        self.gates = nn.ParameterList(nn.Parameter(torch.ones(r, **factory)) for r in ranks)
        for k, r in enumerate(ranks):
            self.register_buffer(f"alive_{k}", torch.ones(r, dtype=torch.bool, device=device))
        self.reset_cores(std)

    def token_cores(self) -> list[int]:
        """Indices of the cores indexed by tokens: every core of a vocabulary layer (a token table's cores each hold a
        factor of its rows); none of any other layer. A vocabulary head overrides this (``TTLinear``)."""
        return list(range(len(self.cores))) if self.vocabulary_layer else []

    # ------------------------------------------------------------------ construction
    @torch.no_grad()
    def reset_cores(self, std: float) -> None:
        """Random cores whose full tensor has entries of standard deviation ``std`` (docs/METHOD.md §1.1)."""
        scale = std ** (1.0 / len(self.cores))
        for core in self.cores:
            core.normal_(0.0, scale / math.sqrt(core.shape[-1]))
        for gate in self.gates:
            gate.fill_(1.0)
        for alive in self._alive_masks():
            alive.fill_(True)

    @torch.no_grad()
    def load_cores_(self, cores: Sequence[torch.Tensor]) -> None:
        """Replace the cores (e.g. from TT-SVD), resizing ranks; all gates reset to 1 and alive."""
        if len(cores) != len(self.cores):
            raise ValueError(f"expected {len(self.cores)} cores, got {len(cores)}")
        for k, (param, value) in enumerate(zip(list(self.cores), cores)):
            value = value.to(param.dtype).to(param.device).reshape(value.shape[0], *param.shape[1:-1], value.shape[-1])
            self.cores[k] = _fresh_parameter(value, param)
        for k, gate in enumerate(list(self.gates)):
            rank = self.cores[k].shape[-1]
            self.gates[k] = _fresh_parameter(torch.ones(rank, dtype=gate.dtype, device=gate.device), gate)
            setattr(self, f"alive_{k}", torch.ones(rank, dtype=torch.bool, device=gate.device))

    # ------------------------------------------------------------------ inference cache
    def cached(self, key: object, compute: Callable[[], object]) -> object:
        """``compute()``, reused at inference until a core, gate or mask changes (``inference_cache.py``).

        In training mode or with grad enabled this is just ``compute()``: nothing is kept.
        """
        if not caching_allowed(self.training):
            return compute()
        tensors = self.state_tensors()
        cache = self.__dict__.get("_inference_cache")
        if cache is None or not cache.matches(tensors, self.gate_threshold):
            cache = InferenceCache.of(tensors, self.gate_threshold)
            self.__dict__["_inference_cache"] = cache
        return cache.get(key, compute)

    def state_tensors(self) -> list[torch.Tensor]:
        """The cores, gates and ``alive`` masks: every tensor a cached contraction depends on.

        Read from the modules' dicts (``_listed``): iterating a ``ParameterList`` costs more than the
        check it serves, which runs on every served batch.
        """
        return [*_listed(self.cores), *_listed(self.gates), *self._alive_masks()]

    def clear_inference_cache(self) -> None:
        """Drop the cached factors (they are rebuilt on the next inference call)."""
        self.__dict__.pop("_inference_cache", None)

    def train(self, mode: bool = True) -> "TTModule":
        if mode:  # training changes the cores: free the cached factors now
            self.clear_inference_cache()
        return super().train(mode)

    def __getstate__(self) -> dict:
        state = dict(super().__getstate__())
        state.pop("_inference_cache", None)  # weak references do not pickle; the cache is rebuilt anyway
        state.pop("_halves_group", None)  # the group and the bank hold other layers: a copy works alone
        state.pop("_gate_bank", None)
        return state

    # ------------------------------------------------------------------ gates and ranks
    def _alive_masks(self) -> list[torch.Tensor]:
        return [self._buffers[f"alive_{k}"] for k in range(len(self.gates))]

    def gate_masks(self) -> list[torch.Tensor]:
        """Boolean mask of the live indices of every bond, on device, by the rule of ``gate_masks.py`` (a NaN gate stays
        live; unless ``allow_rank0``, no bond dies). Latched (``masks_latched``): the ``alive`` buffers, no kernel."""
        return self._alive_masks() if self.masks_latched() else self._rule_masks()

    def _rule_masks(self) -> list[torch.Tensor]:
        return rule_masks(self._alive_masks(), _listed(self.gates), self.gate_threshold, self.allow_rank0)

    def _mask_key(self) -> tuple:
        """What the masks depend on, read on the host: each gate's and buffer's identity and version, the rule's settings."""
        tensors = (*_listed(self.gates), *self._alive_masks())
        return (self.gate_threshold, self.allow_rank0, *((id(t), t._version) for t in tensors))

    def masks_latched(self, key: tuple | None = None) -> bool:
        """Whether the ``alive`` buffers are the masks now (nothing changed since the latch: in-place writes bump versions)."""
        return not torch.compiler.is_compiling() and self.__dict__.get("_latched_key") == (key or self._mask_key())

    def note_latched(self) -> None:
        """The ``alive`` buffers were just set to the masks (``_latch``, or ``GateBank.latch_`` for many layers)."""
        self.__dict__["_latched_key"] = self._mask_key()

    def bond_scales(self) -> list[torch.Tensor]:
        """Each bond's masked gate in the cores' dtype; latched, the gates themselves (dead ones zeroed: ``grad_masked``)."""
        key = None if torch.compiler.is_compiling() else self._mask_key()  # read once: a forward's hot path
        if self.masks_latched(key):
            bank = self.__dict__.get("_gate_bank")  # the model's gates in one vector this step (gate_bank.py)
            scales = (bank.layer_scales(self, key) if bank is not None else None) or [
                grad_masked(gate, alive) for gate, alive in zip(_listed(self.gates), self._alive_masks())]
            return [s if s.dtype == core.dtype else s.to(core.dtype) for core, s in zip(_listed(self.cores), scales)]
        masks = self._rule_masks()
        if self.training and not torch.compiler.is_compiling():  # compiled: the trainer latches (rank.latch_dead_gates_)
            self._latch(masks)
        return [(gate * mask).to(core.dtype) for core, gate, mask in zip(_listed(self.cores), _listed(self.gates), masks)]

    def gated_cores(self, unfolded: int | None = None, scales: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Cores with each bond's masked gate (``bond_scales()``) folded into the core on its left, but bond ``unfolded``'s."""
        cores = _listed(self.cores)
        for k, scale in enumerate(self.bond_scales() if scales is None else scales):
            if k != unfolded:
                cores[k] = cores[k] * scale
        return cores

    @torch.no_grad()
    def _latch(self, masks: list[torch.Tensor]) -> None:
        """Dead gates stay dead, whatever the optimizer does: the alive buffers only lose indices; dead gates go to zero."""
        alive = self._alive_masks()
        torch._foreach_copy_(alive, masks)
        torch._foreach_mul_(_listed(self.gates), alive)
        self.note_latched()

    @torch.no_grad()
    def kill_(self, bond: int, indices: Sequence[int]) -> None:
        """Mark these indices of ``bond`` dead for good (``prune_`` slices them out)."""
        self._alive_masks()[bond][torch.as_tensor(list(indices), dtype=torch.long, device=self.gates[bond].device)] = False

    @torch.no_grad()
    def align_bond_(self, bond: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Re-express cores ``bond`` and ``bond + 1`` in the SVD basis of the unfolding across ``bond``; the layer's
        tensor is unchanged (up to the cores' rounding). The bond's live indices come first, strongest first (as many
        as were live: directions it does not have come last, at zero), its gates at 1.

        Returns ``(M, N, s)`` in float64 (``layers/bond_basis.py``): core ``bond``'s right rank axis was multiplied by
        ``M``, core ``bond + 1``'s left one by ``N``, ``s`` the singular values; state kept elsewhere follows with them
        (``optim.state.rotate_optimizer_state_``).
        """
        def as_3d(core: torch.Tensor) -> torch.Tensor:
            return core.detach().double().reshape(core.shape[0], -1, core.shape[-1])

        gated = [as_3d(core) for core in self.gated_cores()]
        own = as_3d(self.cores[bond])  # the bond's own gate goes between the two sides
        left = contract_chain(gated[:bond] + [own]).reshape(-1, own.shape[-1])
        right = contract_chain(gated[bond + 1 :]).reshape(own.shape[-1], -1)
        m, n, s = svd_basis(left, self.bond_scales()[bond].detach(), right)
        live = int(self.gate_masks()[bond].sum())
        first, second = self.cores[bond], self.cores[bond + 1]
        first.copy_(torch.tensordot(first.double(), m, dims=([first.dim() - 1], [0])).to(first.dtype))
        second.copy_(torch.tensordot(n, second.double(), dims=([1], [0])).to(second.dtype))
        self.gates[bond].fill_(1.0)
        alive = self._alive_masks()[bond]
        alive.fill_(False)
        alive[:live] = True
        return m, n, s

    def latch_dead_gates_(self) -> None:
        """Mark the gates now at or below the threshold dead for good (forward does it in eager training; nothing to do
        when the masks are latched already).

        A ``torch.compile``d forward leaves it out (an in-place buffer update in a step that calls the
        layer twice breaks the compiled backward); whoever trains a compiled model calls this after each
        step (``ComeraCallback`` does).
        """
        if not self.masks_latched():
            self._latch(self._rule_masks())

    def dead_output(self, shape: tuple[int, ...], inputs: torch.Tensor) -> torch.Tensor:
        """Zeros of ``shape``: the output of a train with a bond at rank 0, still tied to its inputs and parameters.

        The tie (a zero term) keeps every parameter of the model in the backward graph: without it the
        cores, the gates and, in a model without residual paths, every layer before this one get no
        gradient, and DDP stops with "parameters that were not used in producing the loss".
        """
        touch = sum(p.float().sum() for p in (*self.cores, *self.gates)) + inputs.float().sum()  # fp32: no fp16 overflow
        return inputs.new_zeros(shape) + (0 * touch).to(inputs.dtype)

    @property
    def physical_ranks(self) -> tuple[int, ...]:
        """Bond ranks as stored (what compute and memory pay for)."""
        return tuple(core.shape[-1] for core in _listed(self.cores)[:-1])

    @property
    def ranks(self) -> tuple[int, ...]:
        """Bond ranks now active (live gates above the threshold); syncs with the device."""
        return tuple(int(mask.sum()) for mask in self.gate_masks())

    def active_size(self) -> torch.Tensor:
        """Exact parameter count of the cores at the active ranks, as a device tensor (no sync)."""
        counts = [torch.ones((), device=self.cores[0].device)]
        counts += [mask.sum().to(counts[0].dtype) for mask in self.gate_masks()]
        counts.append(counts[0])
        total = counts[0] * 0
        for k, modes in enumerate(self.core_modes):
            total = total + counts[k] * math.prod(modes) * counts[k + 1]
        return total

    # ------------------------------------------------------------------ physical pruning
    @torch.no_grad()
    def prune_(self, on_slice: Callable[[PruneRecord], None] | None = None) -> list[PruneRecord]:
        """Slice dead rank indices out of cores, gates and alive masks; return what was sliced.

        Each sliced parameter is replaced by a new ``nn.Parameter`` (gradient sliced along).
        ``on_slice`` runs right after each single slice, so state kept elsewhere (optimizer
        param groups and moments) can follow one dim at a time, even when a core loses indices
        on both sides.
        """
        records: list[PruneRecord] = []
        for k, mask in enumerate(self.gate_masks()):
            if bool(mask.all()):
                continue
            keep = mask.nonzero().flatten()
            setattr(self, f"alive_{k}", getattr(self, f"alive_{k}").index_select(0, keep))
            for params, idx, dim in ((self.cores, k, self.cores[k].dim() - 1), (self.cores, k + 1, 0), (self.gates, k, 0)):
                old = params[idx]
                new = _fresh_parameter(old.index_select(dim, keep), old)
                if old.grad is not None:
                    new.grad = old.grad.index_select(dim, keep)
                params[idx] = new
                records.append(PruneRecord(old, new, dim, keep))
                if on_slice is not None:
                    on_slice(records[-1])
        return records

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        """Resize cores, gates and masks to the ranks stored in the checkpoint, then load.

        Only rank axes may differ: a stored core whose mode axes differ (another vocabulary, another
        layer shape) is an error naming the layer, before anything is changed.
        """
        mismatch = self._mode_mismatch(state_dict, prefix)
        if mismatch:
            error_msgs.append(mismatch)
            for key in [k for k in state_dict if k.startswith(prefix)]:
                del state_dict[key]  # so the cores/gates lists below this module load nothing either
            return
        for params, name in ((self.cores, "cores"), (self.gates, "gates")):
            for k, param in enumerate(list(params)):
                stored = state_dict.get(f"{prefix}{name}.{k}")
                if stored is not None and stored.dim() == param.dim() and stored.shape != param.shape:
                    params[k] = _fresh_parameter(torch.empty(stored.shape, dtype=param.dtype, device=param.device), param)
        for k in range(len(self.gates)):
            stored = state_dict.get(f"{prefix}alive_{k}")
            if stored is not None and stored.shape != getattr(self, f"alive_{k}").shape:
                setattr(self, f"alive_{k}", torch.ones_like(stored, dtype=torch.bool, device=self.gates[k].device))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    def _mode_mismatch(self, state_dict: dict, prefix: str) -> str | None:
        """Why the stored cores cannot load into this layer (their mode axes differ), or None."""
        for k, core in enumerate(self.cores):
            stored = state_dict.get(f"{prefix}cores.{k}")
            if stored is not None and tuple(stored.shape[1:-1]) != tuple(core.shape[1:-1]):
                return (
                    f"{prefix.rstrip('.') or type(self).__name__}: the checkpoint's core {k} has mode axes "
                    f"{tuple(stored.shape[1:-1])}, this {type(self).__name__} has {tuple(core.shape[1:-1])} "
                    f"({self.extra_repr()}). The checkpoint was written for a layer of another shape (e.g. another "
                    "vocabulary or width): build the model with the checkpoint's sizes and tensorize settings."
                )
        return None
