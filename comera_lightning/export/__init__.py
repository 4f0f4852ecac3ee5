"""``export``: a trained tensorized model as a plain-PyTorch ``torch.export.ExportedProgram``.

The program holds every TT layer in the inference form ``prefer`` chooses (``choice.py``): by default
the smallest, so a model compressed in training stays compressed (its cores; hot rows only when
``hot_rows`` asks for them); ``prefer="speed"`` expands small tables and layers, and serves large
tables' misses from half tables, where that measured faster. It holds nothing of comera_lightning,
Lightning or TorchRec: ``torch.export.load(path).module()(*inputs)`` runs with torch alone.
``export_with_report`` also returns the per-layer table (``ExportReport``).
docs/INFERENCE.md has the forms, the tolerance and the measured sizes and speeds.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from comera_lightning.export.choice import PREFER, check_choice, embedding_form, linear_form
from comera_lightning.export.dlrm import dense_input_dlrm, is_dlrm
from comera_lightning.export.report import ExportReport, LayerForm, module_bytes, tensor_bytes
from comera_lightning.layers import TTEmbedding, TTLinear, TTModule
from comera_lightning.rank import tt_layers

__all__ = ["PREFER", "ExportReport", "LayerForm", "export", "export_with_report", "inference_copy"]

log = logging.getLogger(__name__)


def inference_copy(model: nn.Module, example_inputs: Sequence[Any] = (), prefer: str = "size",
                   hot_rows: bool | int | None = None) -> tuple[nn.Module, list[LayerForm]]:
    """A copy of ``model`` in eval mode, dead ranks pruned, every TT layer in its inference form, and those forms.

    ``model`` is untouched. With ``prefer="speed"``, ``example_inputs`` (run once through the copy) give
    each ``TTLinear`` the number of rows it sees per call, which decides between cores and factors
    (``choice.py``). A ``DLRMClassifier`` (or a TorchRec ``DLRM``) becomes its dense-tensor entry point
    (``dlrm.DenseInputDLRM``): ``(dense (B, num_dense), ids (B, features, L))``, -1 = no id.
    """
    check_choice(prefer, hot_rows)
    if is_dlrm(model):
        return dense_input_dlrm(model, prefer, hot_rows)
    trainer = getattr(model, "_trainer", None)
    plain = copy.deepcopy(model, {id(trainer): None} if trainer is not None else {}).eval()
    for _, layer in tt_layers(plain):
        layer.prune_()  # dead indices (gates at or below the threshold) carry nothing: slice them out
    rows = _rows_per_call(plain, example_inputs) if example_inputs and prefer == "speed" else {}
    return plain, replace_tt_layers_(plain, rows, prefer, hot_rows)


def _rows_per_call(model: nn.Module, example_inputs: Sequence[Any]) -> dict[str, int]:
    """Rows each ``TTLinear`` of ``model`` gets per call on ``example_inputs`` (its largest call)."""
    rows: dict[str, int] = {}
    hooks = [
        layer.register_forward_pre_hook(
            lambda _, args, name=name, width=layer.in_features: rows.__setitem__(name, max(rows.get(name, 0), args[0].numel() // width))
        )
        for name, layer in tt_layers(model) if isinstance(layer, TTLinear)
    ]
    try:
        with torch.no_grad():
            model(*example_inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return rows


def replace_tt_layers_(module: nn.Module, rows: dict[str, int] | None = None, prefer: str = "size",
                       hot_rows: bool | int | None = None) -> list[LayerForm]:
    """Swap every ``TTLinear``/``TTEmbedding`` under ``module`` (in eval mode) for its inference form, in place.

    ``rows``: rows per call of each ``TTLinear`` by name (``_rows_per_call``; ``prefer="speed"`` only);
    ``prefer``, ``hot_rows``: as in :func:`export`. Returns the form each layer took.
    """
    rows, forms = rows or {}, []
    for name, layer in list(module.named_modules()):
        if not isinstance(layer, TTModule):
            continue
        if isinstance(layer, TTLinear):
            chosen = linear_form(layer, rows.get(name, 0), prefer)
        elif isinstance(layer, TTEmbedding):
            chosen = embedding_form(layer, prefer, hot_rows)
        else:
            raise TypeError(f"export has no inference form for {name} ({type(layer).__name__}).")
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name)
        if type(parent).__name__ == "TTEmbeddingBagCollection":
            raise TypeError(
                f"{parent_name} is a TTEmbeddingBagCollection, whose KeyedJaggedTensor inputs need TorchRec to load: "
                "export the DLRMClassifier (dense-tensor entry point, docs/INFERENCE_EXPORT.md) or call to_dense first."
            )
        setattr(parent, child, chosen.module)
        forms.append(LayerForm(name, chosen.form, module_bytes(chosen.module), chosen.why))
    return forms


def _auto_dims(example_inputs: Sequence[Any]) -> tuple[Any, ...]:
    """Every dim of every tensor input ``Dim.AUTO``: export keeps dynamic what the model lets vary (batch, length)."""
    return tuple({d: torch.export.Dim.AUTO for d in range(x.dim())} if isinstance(x, torch.Tensor) else None for x in example_inputs)


def export(
    model: nn.Module,
    example_inputs: Sequence[Any],
    path: str | os.PathLike | None = None,
    *,
    prefer: str = "size",
    hot_rows: bool | int | None = None,
    dynamic_shapes: Any = "auto",
    overwrite: bool = False,
) -> torch.export.ExportedProgram:
    """Export a trained tensorized model for inference; write it with ``torch.export.save`` when ``path`` is given.

    ``example_inputs``: the positional inputs of ``model.forward`` (for a ``DLRMClassifier``:
    ``(dense, ids)``, see ``kjt_to_ids``); use a batch of at least 2 so the batch size stays
    dynamic (torch.export specialises sizes 0 and 1). ``prefer``: ``"size"`` (the smallest form of
    every TT layer: what was trained compressed stays compressed) or ``"speed"`` (small tables and
    layers expanded, large tables' misses served from half tables, where that measured faster);
    ``hot_rows``: None (``prefer``'s default: none for "size"), False, True (each table's
    ``cache_rows`` most frequent counted rows) or a budget in bytes per table (``choice.py``).
    ``dynamic_shapes="auto"`` lets every dim vary that the model allows; pass ``None`` for static
    shapes or a ``torch.export`` spec. ``path`` must not exist unless ``overwrite=True``. The outputs
    equal ``model``'s in eval mode up to float rounding (the cores are contracted in another order:
    about 1e-5 relative in float32). The per-layer table is logged at INFO; ``export_with_report``
    returns it.
    """
    return export_with_report(model, example_inputs, path, prefer=prefer, hot_rows=hot_rows, dynamic_shapes=dynamic_shapes,
                              overwrite=overwrite)[0]


def export_with_report(
    model: nn.Module,
    example_inputs: Sequence[Any],
    path: str | os.PathLike | None = None,
    *,
    prefer: str = "size",
    hot_rows: bool | int | None = None,
    dynamic_shapes: Any = "auto",
    overwrite: bool = False,
) -> tuple[torch.export.ExportedProgram, ExportReport]:
    """``export``, and the form each TT layer took, its bytes and why, with the program's size (``ExportReport``)."""
    check_choice(prefer, hot_rows)
    example_inputs = tuple(example_inputs)
    target = Path(path) if path is not None else None
    if target is not None and target.exists() and (target.is_dir() or not overwrite):
        what = "a directory" if target.is_dir() else "an existing file (pass overwrite=True to replace it)"
        raise FileExistsError(f"export: {target} is {what}; choose another path.")
    if dynamic_shapes == "auto":
        dynamic_shapes = _auto_dims(example_inputs)
    forms: list[LayerForm] = []

    def plain() -> nn.Module:
        module, forms[:] = inference_copy(model, example_inputs, prefer, hot_rows)
        _without_kv_cache(module)
        return module

    program = _trace(plain, example_inputs, dynamic_shapes)
    _drop_debug_metadata(program)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial.pt2")  # torch.export.save wants the .pt2 suffix
        torch.export.save(program, partial)
        partial.replace(target)
    stored = tensor_bytes([*program.state_dict.values(), *(t for t in program.constants.values() if isinstance(t, torch.Tensor))])
    report = ExportReport(prefer, tuple(forms), stored, tensor_bytes(model.parameters()))
    log.info("%s", report)
    return program, report


def _without_kv_cache(module: nn.Module) -> None:
    """Turn off a Hugging Face model's KV cache in the copy being exported: ``past_key_values`` is an output
    ``torch.export`` cannot return (a ``DynamicCache``), and a served forward does not need it."""
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if getattr(config, "use_cache", False):
            config.use_cache = False
            log.info("export: %s served without its KV cache (use_cache=False in the exported copy).", type(sub).__name__)


def _trace(plain: Callable[[], nn.Module], example_inputs: tuple, dynamic_shapes: Any) -> torch.export.ExportedProgram:
    """``torch.export.export`` of ``plain()``; where the model branches on a tensor's value, ``draft_export``.

    torch's own ``nn.Transformer`` does (the decoder compares ``tgt_mask`` with a causal mask, Lightning's demo
    Transformer passes one), and ``torch.export`` cannot trace it, dense or not. ``draft_export`` takes the branch
    the example inputs take and asserts in the program that later inputs take it too (with fixed shapes where
    torch's draft mode cannot keep them dynamic). Each try traces a fresh copy: a failed trace can leave fake
    tensors in the module (the demo caches its mask on ``self``).
    """
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    def fresh(inputs: tuple) -> tuple:  # a trace marks its input tensors dynamic; the next try must not inherit that
        return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs)

    with torch.no_grad():
        try:
            return torch.export.export(plain(), example_inputs, dynamic_shapes=dynamic_shapes, strict=False)
        except GuardOnDataDependentSymNode as err:
            log.warning("export: the model branches on a tensor's value (%s); exported with torch.export.draft_export, which "
                        "follows the example inputs' branch and asserts it at run time.", str(err).splitlines()[0])
        try:
            return torch.export.draft_export(plain(), fresh(example_inputs), dynamic_shapes=dynamic_shapes, strict=False)
        except Exception:  # torch's draft mode loses track of some dynamic sizes
            if dynamic_shapes is None:
                raise
            log.warning("export: draft_export failed with dynamic shapes; the program's input shapes are fixed to the example inputs'.")
            return torch.export.draft_export(plain(), fresh(example_inputs), dynamic_shapes=None, strict=False)


#: Per-node metadata the program does not need to run: stack traces and module paths were 60 % of the
#: paper Transformer's file (3.78 MB -> 2.31 MB without them; its pruned parameters are 0.99 MB).
_DEBUG_METADATA = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn")


def _drop_debug_metadata(program: torch.export.ExportedProgram) -> None:
    """Strip debugging metadata from every node (``torch.export.unflatten`` needs the module paths: not kept)."""
    for node in program.graph.nodes:
        for key in _DEBUG_METADATA:
            node.meta.pop(key, None)
