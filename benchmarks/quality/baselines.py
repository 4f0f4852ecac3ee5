"""Plain compression baselines a user might write instead of CoMERA (``benchmarks/quality/compress.py``, issue #52).

* ``activation_scales`` + ``asvd_factors_``: activation-aware SVD (ASVD, Yuan et al. 2023): each linear layer's input
  features weighted by their mean |activation|^α on calibration batches before the truncated SVD, so the directions
  the data uses are kept; token tables (no activations in) take the plain SVD.
* ``fisher_scales`` + ``fwsvd_factors_``: Fisher-weighted SVD (FWSVD, Hsu et al. 2022): each linear layer's output
  features weighted by the square root of their summed squared loss gradients on calibration batches (the Fisher
  information of the weight's rows) before the truncated SVD, so the outputs the loss is sensitive to are kept.
* ``kfac_statistics`` + ``kfac_factors_``: the truncation the loss feels least under K-FAC's model of the Fisher
  (both of the above at once, with whole covariances: SVD-LLM's input whitening and its output-gradient twin): each
  layer's SVD taken of ``G^½ · W · A^½`` (``A``: its inputs' second moment, ``G``: its outputs' loss gradients',
  on calibration batches), truncated, and whitened back; ``measured_ranks`` chooses each layer's rank by measuring
  the loss of cutting it alone (the allocation of OWL and BESA, here by loss per weight), before any training.
* ``magnitude_prune_``: ``torch.nn.utils.prune`` global magnitude pruning of the same layers' weights down to a count
  of nonzeros (unstructured: it saves parameters only where sparse storage is used).
* ``distilled_``, ``distilled_output_``: the trained model as teacher of a plain path (CoMERA's ``Teacher``, outside
  the callback), for a LightningModule's training step or a Hugging Face model's ``loss``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from benchmarks.quality.models import _shape, stored_in_out, svd_factors_
from comera_lightning.callback.distill import DistillConfig, Teacher

#: ASVD's exponent of the mean absolute activation (their default).
ASVD_ALPHA = 0.5


@torch.no_grad()
def activation_scales(model: nn.Module, names: Iterable[str], batches: Iterable[dict[str, torch.Tensor]],
                      alpha: float = ASVD_ALPHA) -> dict[str, torch.Tensor]:
    """Per input feature of each named linear-like layer: (mean |x|)^α over the batches' forwards."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def hook(name: str):
        def record(module: nn.Module, args: tuple) -> None:
            x = args[0].detach().float().flatten(0, -2).abs()
            sums[name] = sums.get(name, 0) + x.sum(0)
            counts[name] = counts.get(name, 0) + x.shape[0]
        return record

    handles = [model.get_submodule(n).register_forward_pre_hook(hook(n)) for n in names
               if not isinstance(model.get_submodule(n), nn.Embedding)]
    try:
        for batch in batches:
            model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    return {n: (sums[n] / counts[n]).clamp_min(1e-6) ** alpha for n in sums}


def asvd_factors_(model: nn.Module, ranks: dict[str, int], scales: dict[str, torch.Tensor]) -> None:
    """``svd_factors_`` with each linear layer's SVD taken of ``diag(scale) · W`` and the scale undone on the input
    factor: the rank-r product closest to W where the inputs are large."""
    _scaled_svd_factors_(model, ranks, scales, outputs=False)


def fisher_scales(model: nn.Module, names: Iterable[str], batches: Iterable[Any],
                  loss_of: Callable[[nn.Module, Any], torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per output feature of each named linear-like layer: √(Σ over the batches of its weight row's squared
    gradients of ``loss_of(model, batch)``), relative to the layer's mean (token tables are left out, as in ASVD)."""
    layers = {n: model.get_submodule(n) for n in names if not isinstance(model.get_submodule(n), nn.Embedding)}
    sums: dict[str, torch.Tensor] = {}
    for batch in batches:
        model.zero_grad(set_to_none=True)
        loss_of(model, batch).backward()
        for name, layer in layers.items():
            grad = _as_layer(layer, layer.weight.grad.float())  # (in, out) either way: the transpose is its own inverse
            sums[name] = sums.get(name, 0) + grad.pow(2).sum(0)
    model.zero_grad(set_to_none=True)
    scales = {n: total.sqrt() for n, total in sums.items()}
    return {n: (scale / scale.mean()).clamp_min(1e-3) for n, scale in scales.items()}


def fwsvd_factors_(model: nn.Module, ranks: dict[str, int], scales: dict[str, torch.Tensor]) -> None:
    """``svd_factors_`` with each linear layer's SVD taken of ``W · diag(scale)`` over its outputs and the scale undone
    on the output factor: the rank-r product closest to W where the loss is sensitive."""
    _scaled_svd_factors_(model, ranks, scales, outputs=True)


@torch.no_grad()
def _scaled_svd_factors_(model: nn.Module, ranks: dict[str, int], scales: dict[str, torch.Tensor], outputs: bool) -> None:
    """``svd_factors_`` of each scaled layer's weight, its input (``outputs`` False) or output features multiplied by
    ``scales``, the scale then divided out of that side's factor (``u``: inputs × rank; ``v``: rank × outputs)."""
    scales = {n: scale[None, :] if outputs else scale[:, None] for n, scale in scales.items() if n in ranks}
    for name, scale in scales.items():
        layer = model.get_submodule(name)
        weight = layer.weight if type(layer).__name__ == "Conv1D" else layer.weight.T  # (in, out)
        layer.weight.copy_(_as_layer(layer, weight * scale))
    svd_factors_(model, ranks)
    for name, scale in scales.items():
        factor = model.get_submodule(name).v if outputs else model.get_submodule(name).u
        factor.div_(scale.to(factor))


#: K-FAC's damping: each second moment gains this share of its mean diagonal before its square root is inverted.
KFAC_DAMPING = 1e-2


def kfac_statistics(model: nn.Module, names: Iterable[str], batches: Iterable[Any],
                    loss_of: Callable[[nn.Module, Any], torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per named layer, ``(A, G)``: the second moments of its inputs (a token table's: its rows' frequencies, a vector:
    the diagonal of ``A``) and of its outputs' gradients of ``loss_of(model, batch)``, averaged over the batches'
    tokens. Whole matrices otherwise: for layers up to a few thousand features wide (a 32,000-token head's ``G`` alone
    would take 4 GB)."""
    layers = {n: model.get_submodule(n) for n in names}
    sums: dict[str, list[torch.Tensor]] = {n: [0, 0] for n in layers}
    tokens: dict[str, int] = dict.fromkeys(layers, 0)

    def record_input(name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            x = args[0].detach()
            if isinstance(module, nn.Embedding):
                sums[name][0] = sums[name][0] + torch.bincount(x.flatten(), minlength=module.num_embeddings).float()
            else:
                x = x.float().flatten(0, -2)
                sums[name][0] = sums[name][0] + x.T @ x
            tokens[name] += x.numel() if isinstance(module, nn.Embedding) else x.shape[0]
        return hook

    def record_gradient(name: str):
        def hook(module: nn.Module, grad_input: tuple, grad_output: tuple) -> None:
            g = grad_output[0].detach().float().flatten(0, -2)
            sums[name][1] = sums[name][1] + g.T @ g
        return hook

    handles = [h for n, layer in layers.items() for h in (layer.register_forward_pre_hook(record_input(n)),
                                                         layer.register_full_backward_hook(record_gradient(n)))]
    try:
        with warnings.catch_warnings():  # a first layer's inputs (ids, data) need no gradient: its hook fires all the same
            warnings.filterwarnings("ignore", "Full backward hook is firing", UserWarning)
            for batch in batches:
                model.zero_grad(set_to_none=True)
                loss_of(model, batch).backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    return {n: (a / tokens[n], g / tokens[n]) for n, (a, g) in sums.items()}


@torch.no_grad()
def kfac_factors_(model: nn.Module, ranks: dict[str, int], statistics: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """``svd_factors_`` of each layer's rank-r truncation in K-FAC's basis: ``G^-½ · trunc_r(G^½ W A^½) · A^-½``
    (``W`` as ``y = W x``); the factors then split it evenly, as the plain path's do."""
    for name, (a, g) in statistics.items():
        if name in ranks:
            layer = model.get_submodule(name)
            layer.weight.copy_(_KfacSpectrum(layer, a, g).truncated(ranks[name]).to(layer.weight))
    svd_factors_(model, ranks)


#: Ranks per layer at which ``measured_ranks`` measures the loss of cutting it, spread evenly up to its full rank.
MEASURED_RANKS_PER_LAYER = 16
#: How many ranks ahead the allocation looks for the next best buy (a layer's measured loss is not convex in its rank).
RANKS_AHEAD = 8


@torch.no_grad()
def measured_ranks(model: nn.Module, statistics: dict[str, tuple[torch.Tensor, torch.Tensor]], weights: int,
                   batches: list[Any], loss_of: Callable[[nn.Module, Any], torch.Tensor]) -> dict[str, int]:
    """Ranks of the layers of ``statistics`` whose factors hold at most ``weights``, chosen by measuring: each layer cut
    alone in K-FAC's basis to ``MEASURED_RANKS_PER_LAYER`` ranks, the loss on ``batches`` at each (linear between
    them); then, from rank 1 everywhere, the ranks that buy the most loss per weight, until ``weights`` is spent."""
    training = model.training
    model.eval()

    def loss() -> float:
        return sum(float(loss_of(model, batch)) for batch in batches) / len(batches)

    dense, costs = loss(), {}
    rises: dict[str, list[float]] = {}  # a layer's loss rise at every rank, 0 ... full
    for name, (a, g) in statistics.items():
        layer = model.get_submodule(name)
        rows, cols, _ = _shape(layer)
        costs[name], spectrum, kept = rows + cols, _KfacSpectrum(layer, a, g), layer.weight.clone()
        full, measured = spectrum.full_rank, {}
        every = max(1, full // MEASURED_RANKS_PER_LAYER)
        for rank in sorted({1, *range(every, full + 1, every), full}):
            layer.weight.copy_(spectrum.truncated(rank).to(kept))
            measured[rank] = loss() - dense
        layer.weight.copy_(kept)
        rises[name] = _interpolated(measured, full)
    model.train(training)
    ranks = dict.fromkeys(statistics, 1)
    spent = sum(costs.values())
    while True:
        buys = [((rises[n][r] - rises[n][r + k]) / (k * costs[n]), n, k) for n, r in ranks.items()
                for k in range(1, RANKS_AHEAD + 1) if r + k < len(rises[n]) and spent + k * costs[n] <= weights]
        if not buys:
            return ranks
        _, name, more = max(buys)
        ranks[name] += more
        spent += more * costs[name]


def _interpolated(measured: dict[int, float], full: int) -> list[float]:
    """The loss rise at every rank 0 ... ``full`` from the ranks measured (rank 0: twice rank 1's)."""
    known = {0: 2 * measured[min(measured)], **measured}
    points = sorted(known)
    rises = []
    for rank in range(full + 1):
        upper = next(p for p in points if p >= rank)
        lower = max(p for p in points if p <= rank)
        share = 0.0 if upper == lower else (rank - lower) / (upper - lower)
        rises.append(known[lower] + share * (known[upper] - known[lower]))
    return rises


class _KfacSpectrum:
    """A layer's weight in K-FAC's basis: the SVD of ``G^½ W A^½``, whose rank-r truncations ``truncated`` gives back
    in the layer's own storage order."""

    def __init__(self, layer: nn.Module, inputs: torch.Tensor, gradients: torch.Tensor) -> None:
        self.transposed = stored_in_out(layer)
        weight = layer.weight.float().T if self.transposed else layer.weight.float()  # (out, in)
        (a_half, self.a_inverse), (g_half, self.g_inverse) = _damped_roots(inputs), _damped_roots(gradients)
        self.left, self.singular, self.right = torch.linalg.svd(_on_inputs(g_half @ weight, a_half), full_matrices=False)
        self.full_rank = len(self.singular)

    def truncated(self, rank: int) -> torch.Tensor:
        weight = _on_inputs(self.g_inverse @ (self.left[:, :rank] * self.singular[:rank]) @ self.right[:rank], self.a_inverse)
        return weight.T if self.transposed else weight


def _on_inputs(weight: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
    """``weight @ root``, a vector ``root`` standing for its diagonal matrix (a token table's)."""
    return weight * root if root.dim() == 1 else weight @ root


def _damped_roots(moment: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(M^½, M^-½)`` of a second moment (a vector: a diagonal one's) after ``KFAC_DAMPING`` of its mean diagonal is
    added."""
    diagonal = moment if moment.dim() == 1 else moment.diagonal()
    damping = KFAC_DAMPING * diagonal.mean().clamp_min(1e-12)
    if moment.dim() == 1:
        return (moment + damping).sqrt(), (moment + damping).rsqrt()
    values, vectors = torch.linalg.eigh(moment + damping * torch.eye(len(moment), device=moment.device))
    values = values.clamp_min(1e-12)
    return (vectors * values.sqrt()) @ vectors.T, (vectors / values.sqrt()) @ vectors.T


def _as_layer(layer: nn.Module, weight_in_out: torch.Tensor) -> torch.Tensor:
    return weight_in_out if type(layer).__name__ == "Conv1D" else weight_in_out.T


def magnitude_prune_(model: nn.Module, names: Iterable[str], keep: int) -> None:
    """Global magnitude pruning of the named layers' weights to ``keep`` nonzeros (masks kept while fine-tuning)."""
    import torch.nn.utils.prune as prune

    targets = [(model.get_submodule(n), "weight") for n in names]
    total = sum(module.weight.numel() for module, _ in targets)
    prune.global_unstructured(targets, pruning_method=prune.L1Unstructured, amount=max(0, total - keep))


def kept_weights(ranks: dict[str, int], model: nn.Module) -> int:
    """The weights CoMERA's layers hold at ``ranks`` (factors of those ranks), biases not counted."""
    return sum(min(rank * (rows + cols), rows * cols)
               for name, rank in ranks.items() for rows, cols, _ in [_shape(model.get_submodule(name))])


def pruned(model: nn.Module) -> Iterator[tuple[nn.Module, str]]:
    """(module, name) of each weight a ``torch.nn.utils.prune`` mask holds (its ``<name>_orig`` parameter)."""
    for module in model.modules():
        for name, _ in list(module.named_parameters(recurse=False)):
            if name.endswith("_orig"):
                yield module, name.removesuffix("_orig")


def nonzero_parameters(model: nn.Module) -> int:
    """Parameters counting a pruned weight by its nonzeros (``weight_orig`` under its mask)."""
    masks = {id(getattr(module, f"{name}_orig")): getattr(module, f"{name}_mask") for module, name in pruned(model)}
    return sum(int(masks[id(p)].sum()) if id(p) in masks else p.numel() for p in model.parameters())


def distilled_(model: Any, config: dict[str, Any]) -> None:
    """Have the LightningModule ``model`` (dense still: call before factoring it) distil its own trained copy in every
    training step, as CoMERA's ``DistillConfig`` does: the plain path given the teacher CoMERA had."""
    teacher = Teacher(DistillConfig(**config))
    teacher.attach(model)
    step = model.training_step

    def distilling_step(*args: Any, **kwargs: Any) -> torch.Tensor:
        loss = step(*args, **kwargs)
        return teacher.mix(loss, loss)

    model.training_step = distilling_step


def distilled_output_(model: nn.Module, config: dict[str, Any]) -> None:
    """``distilled_`` for a Hugging Face model (dense still: call before factoring it): each training forward's
    ``loss`` becomes the objective with its own trained copy as teacher (the whole model: ``config``'s module aside)."""
    teacher = Teacher(DistillConfig(**{**config, "module": ""}))
    teacher.attach(model)

    def mixed(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        if module.training and torch.is_grad_enabled():
            output.loss = teacher.mix(output.loss, output.loss)
        return output

    model.register_forward_hook(mixed, with_kwargs=True)  # after the teacher's own hook, which leaves its term
