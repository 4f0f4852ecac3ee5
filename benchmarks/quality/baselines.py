"""Plain compression baselines a user might write instead of CoMERA (``benchmarks/quality/compress.py``, issue #52).

* ``activation_scales`` + ``asvd_factors_``: activation-aware SVD (ASVD, Yuan et al. 2023): each linear layer's input
  features weighted by their mean |activation|^α on calibration batches before the truncated SVD, so the directions
  the data uses are kept; token tables (no activations in) take the plain SVD.
* ``fisher_scales`` + ``fwsvd_factors_``: Fisher-weighted SVD (FWSVD, Hsu et al. 2022): each linear layer's output
  features weighted by the square root of their summed squared loss gradients on calibration batches (the Fisher
  information of the weight's rows) before the truncated SVD, so the outputs the loss is sensitive to are kept.
* ``magnitude_prune_``: ``torch.nn.utils.prune`` global magnitude pruning of the same layers' weights down to a count
  of nonzeros (unstructured: it saves parameters only where sparse storage is used).
* ``distilled_``, ``distilled_output_``: the trained model as teacher of a plain path (CoMERA's ``Teacher``, outside
  the callback), for a LightningModule's training step or a Hugging Face model's ``loss``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from benchmarks.quality.models import _shape, svd_factors_
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
